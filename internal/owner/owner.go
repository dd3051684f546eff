// Package owner names a lock client when its user gave no name.
package owner

import (
	"os"

	"github.com/google/uuid"
)

// Default returns the host's name, a dash and a random UUID, as AWS's Java
// lock client names its owners: unique per client, and it says where the
// holder runs.
func Default() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "nolock"
	}
	return host + "-" + uuid.NewString()
}
