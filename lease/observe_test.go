package lease_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/observe"
)

// Every event of a lock's life reaches the observer, in order: acquired,
// renewed, released; contended and not acquired for a rival; expiring and
// lost (with its cause) at the end of a maximum hold. A panicking
// observer breaks nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 4)
	rec := &testenv.Events{}
	a := newClient(t, pool, lease.WithObserver(observe.Func(rec.Observe)))
	rivalRec := &testenv.Events{}
	rival := newClient(t, pool, lease.WithObserver(observe.Func(rivalRec.Observe)))

	l := mustAcquire(t, a, "held")
	if _, err := rival.TryAcquire(context.Background(), "held"); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("rival's TryAcquire: %v, want ErrNotAcquired", err)
	}
	testenv.Until(t, "a renewal is reported", func() (bool, error) {
		return slices.Contains(rec.Names("held"), lease.EventRenewed), nil
	})
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := mustAcquire(t, a, "max", lease.WithMaxHold(testLease))
	<-m.Lost()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rival.Close(); err != nil {
		t.Fatal(err)
	}

	held := slices.Compact(rec.Names("held"))
	if want := []string{lease.EventAcquired, lease.EventRenewed, lease.EventReleased}; !slices.Equal(held, want) {
		t.Errorf("events of a held lock: %v, want %v (renewals compacted)", held, want)
	}
	if got, want := rivalRec.Names("held"), []string{lease.EventContended, lease.EventNotAcquired}; !slices.Equal(got, want) {
		t.Errorf("rival's events: %v, want %v", got, want)
	}
	maxed := slices.DeleteFunc(rec.Names("max"), func(n string) bool { return n == lease.EventRenewed })
	if want := []string{lease.EventAcquired, lease.EventExpiring, lease.EventLost}; !slices.Equal(maxed, want) {
		t.Errorf("events of a lock at its maximum hold: %v, want %v", maxed, want)
	}
	var le *lease.LostError
	if lost := rec.Errs("max", lease.EventLost); len(lost) != 1 || !errors.As(lost[0], &le) || le.Cause != lease.MaxHold {
		t.Errorf("lost events' errors: %v, want one LostError with cause MaxHold", rec.Errs("max", lease.EventLost))
	}

	// An observer that panics on every other event: the lock works, and
	// each panic is counted in the Dropped field of the Client's next
	// event (all but a last one).
	var boom testenv.Panicky
	p := newClient(t, pool, lease.WithObserver(observe.Func(boom.Observe)))
	pl := mustAcquire(t, p, "panicky")
	if err := pl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	boom.Check(t, 1, 1)
}

// A Release whose write fails (here: its ctx was cancelled) reports
// not_released with how long the lock was held, since the Client holds it
// no more; a Release of a lock lost before reports it with no duration.
func TestNotReleased(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 4)
	rec := &testenv.Events{}
	c := newClient(t, pool, lease.WithObserver(observe.Func(rec.Observe)))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	l := mustAcquire(t, c, "cut")
	if err := l.Release(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release with a cancelled ctx: %v, want context.Canceled", err)
	}
	m := mustAcquire(t, c, "max", lease.WithMaxHold(testLease))
	<-m.Lost()
	if err := m.Release(context.Background()); !errors.Is(err, lease.ErrLockLost) {
		t.Fatalf("Release of a lost lock: %v, want ErrLockLost", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if e := rec.Of("cut", lease.EventNotReleased); len(e) != 1 || e[0].Duration <= 0 || !errors.Is(e[0].Err, context.Canceled) {
		t.Errorf("not_released of a lock held until its release: %+v, want one with a duration and context.Canceled", e)
	}
	if e := rec.Of("max", lease.EventNotReleased); len(e) != 1 || e[0].Duration != 0 {
		t.Errorf("not_released of a lock lost before: %+v, want one without a duration", e)
	}
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{lease.EventAcquired, "lease.acquired"},
		{lease.EventNotAcquired, "lease.not_acquired"},
		{lease.EventContended, "lease.contended"},
		{lease.EventRenewed, "lease.renewed"},
		{lease.EventRenewFailed, "lease.renew_failed"},
		{lease.EventExpiring, "lease.expiring"},
		{lease.EventLost, "lease.lost"},
		{lease.EventReleased, "lease.released"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
