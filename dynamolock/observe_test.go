package dynamolock_test

import (
	"context"
	"errors"
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
// bring, depend on the machine's speed: the test leaves them out.
func TestObserver(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	rec := &testenv.Events{}
	a := newClient(t, api, table, dynamolock.WithObserver(observe.Func(rec.Observe)))
	rivalRec := &testenv.Events{}
	rival := newClient(t, api, table, dynamolock.WithObserver(observe.Func(rivalRec.Observe)))

	l := mustAcquire(t, a, "held")
	if _, err := rival.TryAcquire(context.Background(), "held"); !errors.Is(err, dynamolock.ErrNotAcquired) {
		t.Fatalf("rival's TryAcquire: %v, want ErrNotAcquired", err)
	}
	testenv.Until(t, "a heartbeat is reported", func() (bool, error) {
		return slices.Contains(rec.Names("held"), dynamolock.EventRenewed), nil
	})
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := mustAcquire(t, a, "max", dynamolock.WithMaxHold(testLease))
	<-m.Lost()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rival.Close(); err != nil {
		t.Fatal(err)
	}

	slow := func(n string) bool { return n == dynamolock.EventRenewFailed || n == dynamolock.EventExpiring }
	held := slices.Compact(slices.DeleteFunc(rec.Names("held"), slow))
	if want := []string{dynamolock.EventAcquired, dynamolock.EventRenewed, dynamolock.EventReleased}; !slices.Equal(held, want) {
		t.Errorf("events of a held lock: %v, want %v (renewals compacted)", held, want)
	}
	if got, want := rivalRec.Names("held"), []string{dynamolock.EventContended, dynamolock.EventNotAcquired}; !slices.Equal(got, want) {
		t.Errorf("rival's events: %v, want %v", got, want)
	}
	maxed := slices.DeleteFunc(rec.Names("max"), func(n string) bool { return n == dynamolock.EventRenewed || n == dynamolock.EventRenewFailed })
	if want := []string{dynamolock.EventAcquired, dynamolock.EventExpiring, dynamolock.EventLost}; !slices.Equal(maxed, want) {
		t.Errorf("events of a lock at its maximum hold: %v, want %v", maxed, want)
	}
	var le *dynamolock.LostError
	if lost := rec.Errs("max", dynamolock.EventLost); len(lost) != 1 || !errors.As(lost[0], &le) || le.Cause != dynamolock.MaxHold {
		t.Errorf("lost events' errors: %v, want one LostError with cause MaxHold", rec.Errs("max", dynamolock.EventLost))
	}
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
