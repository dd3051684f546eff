package conditional_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Each take's outcome reaches the observer: 40 concurrent takes of one
// unit from 30 give 30 granted and 10 refused events, none failed.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	s := newStock(t, pool, conditional.WithObserver(events.Observe))
	if err := s.Put(ctx, "sku", 30); err != nil {
		t.Fatal(err)
	}
	const takes = 40
	var wg sync.WaitGroup
	for range takes {
		wg.Go(func() { _ = s.Take(ctx, "sku", 1) })
	}
	wg.Wait()
	names := events.Names("sku")
	count := func(name string) int {
		return len(slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n != name }))
	}
	if g, r := count("conditional.granted"), count("conditional.refused"); g != 30 || r != takes-30 {
		t.Errorf("%d granted and %d refused events, want 30 and %d (events: %v)", g, r, takes-30, names)
	}
	if f := count("conditional.failed"); f != 0 {
		t.Errorf("%d failed events, want 0", f)
	}
	t.Logf("%d coalesced statements of the %d takes", count("conditional.batch"), takes)
}
