package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Every event of a lock's life reaches the observer, in order, with the
// same names as package lease's: acquired, renewed, released; contended
// and not acquired for a rival; expiring and lost (with its cause) at the
// end of a maximum hold. A renewal that fails, and the warning it may
// bring, depend on the machine's speed: the test leaves them out, and
// runs again (testenv.Conclusive) where a lock expired with a renewal
// unanswered within the lease.
func TestObserver(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	testenv.Conclusive(t, func(n int) error {
		heldKey, maxKey := fmt.Sprint("held", n), fmt.Sprint("max", n)
		rec := &testenv.Events{}
		a := newClient(t, api, table, dynamolock.WithObserver(observe.Func(rec.Observe)))
		rivalRec := &testenv.Events{}
		rival := newClient(t, api, table, dynamolock.WithObserver(observe.Func(rivalRec.Observe)))

		l := mustAcquire(t, a, heldKey)
		if _, err := rival.TryAcquire(context.Background(), heldKey); !errors.Is(err, dynamolock.ErrNotAcquired) {
			t.Fatalf("rival's TryAcquire: %v, want ErrNotAcquired", err)
		}
		testenv.Until(t, "a heartbeat is reported", func() (bool, error) {
			return slices.Contains(rec.Names(heldKey), dynamolock.EventRenewed) || closed(l.Lost()), nil
		})
		if err := l.Release(context.Background()); unanswered(err) {
			return fmt.Errorf("lock %q: %w", heldKey, err)
		} else if err != nil {
			t.Fatal(err)
		}
		m := mustAcquire(t, a, maxKey, dynamolock.WithMaxHold(testLease))
		<-m.Lost()
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := rival.Close(); err != nil {
			t.Fatal(err)
		}

		slow := func(n string) bool { return n == dynamolock.EventRenewFailed || n == dynamolock.EventExpiring }
		held := slices.Compact(slices.DeleteFunc(rec.Names(heldKey), slow))
		if want := []string{dynamolock.EventAcquired, dynamolock.EventRenewed, dynamolock.EventReleased}; !slices.Equal(held, want) {
			t.Errorf("events of a held lock: %v, want %v (renewals compacted)", held, want)
		}
		if got, want := rivalRec.Names(heldKey), []string{dynamolock.EventContended, dynamolock.EventNotAcquired}; !slices.Equal(got, want) {
			t.Errorf("rival's events: %v, want %v", got, want)
		}
		if err := m.Err(); unanswered(err) {
			return fmt.Errorf("lock %q: %w", maxKey, err)
		}
		maxed := slices.DeleteFunc(rec.Names(maxKey), func(n string) bool { return n == dynamolock.EventRenewed || n == dynamolock.EventRenewFailed })
		if want := []string{dynamolock.EventAcquired, dynamolock.EventExpiring, dynamolock.EventLost}; !slices.Equal(maxed, want) {
			t.Errorf("events of a lock at its maximum hold: %v, want %v", maxed, want)
		}
		var le *dynamolock.LostError
		if lost := rec.Errs(maxKey, dynamolock.EventLost); len(lost) != 1 || !errors.As(lost[0], &le) || le.Cause != dynamolock.MaxHold {
			t.Errorf("lost events' errors: %v, want one LostError with cause MaxHold", rec.Errs(maxKey, dynamolock.EventLost))
		}
		return nil
	})
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{dynamolock.EventAcquired, "dynamolock.acquired"},
		{dynamolock.EventNotAcquired, "dynamolock.not_acquired"},
		{dynamolock.EventContended, "dynamolock.contended"},
		{dynamolock.EventTakeover, "dynamolock.takeover"},
		{dynamolock.EventRenewed, "dynamolock.renewed"},
		{dynamolock.EventRenewFailed, "dynamolock.renew_failed"},
		{dynamolock.EventExpiring, "dynamolock.expiring"},
		{dynamolock.EventLost, "dynamolock.lost"},
		{dynamolock.EventReleased, "dynamolock.released"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
