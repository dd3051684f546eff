package lease_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// Every event of a lock's life reaches the observer, in order: acquired,
// renewed, released; contended and not acquired for a rival; expiring and
// lost (with its cause) at the end of a maximum hold. A panicking
// observer breaks nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 4)
	rec := &testenv.Events{}
	a := newClient(t, pool, lease.WithObserver(rec.Observe))
	rivalRec := &testenv.Events{}
	rival := newClient(t, pool, lease.WithObserver(rivalRec.Observe))

	l := mustAcquire(t, a, "held")
	if _, err := rival.TryAcquire(context.Background(), "held"); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("rival's TryAcquire: %v, want ErrNotAcquired", err)
	}
	testenv.Until(t, "a renewal is reported", func() (bool, error) {
		return slices.Contains(rec.Names("held"), "lease.renewed"), nil
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
	if want := []string{"lease.acquired", "lease.renewed", "lease.released"}; !slices.Equal(held, want) {
		t.Errorf("events of a held lock: %v, want %v (renewals compacted)", held, want)
	}
	if got, want := rivalRec.Names("held"), []string{"lease.contended", "lease.not_acquired"}; !slices.Equal(got, want) {
		t.Errorf("rival's events: %v, want %v", got, want)
	}
	maxed := slices.DeleteFunc(rec.Names("max"), func(n string) bool { return n == "lease.renewed" })
	if want := []string{"lease.acquired", "lease.expiring", "lease.lost"}; !slices.Equal(maxed, want) {
		t.Errorf("events of a lock at its maximum hold: %v, want %v", maxed, want)
	}
	var le *lease.LostError
	if lost := rec.Errs("max", "lease.lost"); len(lost) != 1 || !errors.As(lost[0], &le) || le.Cause != lease.MaxHold {
		t.Errorf("lost events' errors: %v, want one LostError with cause MaxHold", rec.Errs("max", "lease.lost"))
	}

	// An observer that panics on every other event: the lock works, and
	// each panic is counted in the Dropped field of the Client's next
	// event (all but a last one).
	var boom testenv.Panicky
	p := newClient(t, pool, lease.WithObserver(boom.Observe))
	pl := mustAcquire(t, p, "panicky")
	if err := pl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	boom.Check(t, 1, 1)
}
