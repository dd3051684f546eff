package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// Acquire, TryAcquire and Release are calls: End gets the context Start
// returned, once, with the outcome, for a success, a refusal, a cancelled
// ctx and bad input alike; a contended try inside a call has its ctx; a
// Client's Close reports its releases as events, not calls.
func TestCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := testenv.PostgresSchema(t, 4)
	calls := &testenv.Calls{}
	c := newClient(t, pool, lease.WithObserver(calls))
	rival := newClient(t, pool)
	l := mustAcquire(t, c, "mine")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := mustAcquire(t, rival, "theirs")
	defer held.Close()
	if _, err := c.TryAcquire(ctx, "theirs"); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Acquire(cancelled, "theirs"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled ctx: %v", err)
	}
	if _, err := c.Acquire(ctx, ""); !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("Acquire of an empty key: %v", err)
	}
	mustAcquire(t, c, "closed") // released by Close: an event, not a call
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The rival's try was contended, in its call; Close's release of
	// "closed" came from no call.
	if in, out := calls.Events(); in != 1 || out < 1 {
		t.Errorf("%d events in calls (want 1: contended), %d outside (want the release by Close at least)", in, out)
	}
	calls.Want(t, []testenv.WantCall{
		testenv.Ends(lease.CallAcquire, "mine", lease.EventAcquired, false),
		testenv.Ends(lease.CallRelease, "mine", lease.EventReleased, false),
		testenv.Ends(lease.CallTryAcquire, "theirs", lease.EventNotAcquired, true),
		testenv.Ends(lease.CallAcquire, "theirs", lease.EventNotAcquired, true),
		testenv.Ends(lease.CallAcquire, "", lease.EventNotAcquired, true),
		testenv.Ends(lease.CallAcquire, "closed", lease.EventAcquired, false),
	})
}
