package testenv

import (
	"strings"
	"testing"
)

// EnvEtcd names the etcd test server's client URLs, comma-separated
// (scripts/services env prints it).
const EnvEtcd = "NOLOCK_TEST_ETCD"

// Etcd returns the client URLs of the etcd test server (NOLOCK_TEST_ETCD).
// When the variable is unset it fails the test under CI or
// NOLOCK_REQUIRE_SERVICES and skips it otherwise, naming the setup command.
// This package holds no etcd client: the code that uses etcd lives in its
// own module (examples/etcdfence), so the main module needs none.
func Etcd(t testing.TB) []string {
	t.Helper()
	return strings.Split(need(t, EnvEtcd), ",")
}
