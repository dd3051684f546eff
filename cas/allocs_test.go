//go:build !race

// The race detector allocates: these counts hold without it.

package cas_test

import (
	"context"
	"testing"

	"github.com/nolock/nolock/cas"
)

// With no observer, a call costs what it cost before calls were observed:
// Retry of an op that does no I/O, 2 allocations (its options' config).
func TestRetryAllocs(t *testing.T) {
	ctx := context.Background()
	op := func(context.Context) error { return nil }
	if n := testing.AllocsPerRun(1000, func() { _ = cas.Retry(ctx, op) }); n > 2 {
		t.Errorf("Retry: %v allocations, want at most 2", n)
	}
}
