package conditional_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Each Take and Hold is a call: End gets the context Start returned, once,
// with the outcome, for a grant, a refusal, a cancelled ctx and bad input
// alike.
func TestCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	calls := &testenv.Calls{}
	s := newStock(t, pool, conditional.WithObserver(calls))
	if err := s.Put(ctx, "sku", 1); err != nil {
		t.Fatal(err)
	}
	_ = s.Take(ctx, "sku", 1)
	_ = s.Take(ctx, "sku", 1)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_ = s.Take(cancelled, "sku", 1)
	_ = s.Take(ctx, "sku", -1)
	h := newHolds(t, pool, conditional.WithObserver(calls))
	if err := h.Add(ctx, "seat"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.HoldAny(ctx, []string{"seat"}, "bob", time.Minute); !errors.Is(err, conditional.ErrHeld) {
		t.Fatalf("HoldAny of a held seat: %v", err)
	}
	calls.Want(t, []testenv.WantCall{
		testenv.Ends(conditional.CallTake, "sku", conditional.EventGranted, false),
		testenv.Ends(conditional.CallTake, "sku", conditional.EventRefused, true),
		testenv.Ends(conditional.CallTake, "sku", conditional.EventFailed, true),
		testenv.Ends(conditional.CallTake, "sku", conditional.EventFailed, true),
		testenv.Ends(conditional.CallHold, "seat", conditional.EventHeld, false),
		testenv.Ends(conditional.CallHoldAny, "seat", conditional.EventRefused, true),
	})
}
