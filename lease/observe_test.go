package lease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/observe"
)

// recorder is an Observer that keeps the events' names by key.
type recorder struct {
	mu    sync.Mutex
	names map[string][]string
	lost  []error
}

func (r *recorder) observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names[e.Key] = append(r.names[e.Key], e.Name)
	if e.Name == "lease.lost" {
		r.lost = append(r.lost, e.Err)
	}
}

func (r *recorder) of(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.names[key])
}

// Every event of a lock's life reaches the observer, in order: acquired,
// renewed, released; contended and not acquired for a rival; expiring and
// lost (with its cause) at the end of a maximum hold. A panicking
// observer breaks nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 4)
	rec := &recorder{names: map[string][]string{}}
	a := newClient(t, pool, lease.WithObserver(rec.observe))
	rivalRec := &recorder{names: map[string][]string{}}
	rival := newClient(t, pool, lease.WithObserver(rivalRec.observe))

	l := mustAcquire(t, a, "held")
	if _, err := rival.TryAcquire(context.Background(), "held"); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("rival's TryAcquire: %v, want ErrNotAcquired", err)
	}
	testenv.Until(t, "a renewal is reported", func() (bool, error) {
		return slices.Contains(rec.of("held"), "lease.renewed"), nil
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

	held := slices.Compact(rec.of("held"))
	if want := []string{"lease.acquired", "lease.renewed", "lease.released"}; !slices.Equal(held, want) {
		t.Errorf("events of a held lock: %v, want %v (renewals compacted)", held, want)
	}
	if got, want := rivalRec.of("held"), []string{"lease.contended", "lease.not_acquired"}; !slices.Equal(got, want) {
		t.Errorf("rival's events: %v, want %v", got, want)
	}
	maxed := slices.DeleteFunc(rec.of("max"), func(n string) bool { return n == "lease.renewed" })
	if want := []string{"lease.acquired", "lease.expiring", "lease.lost"}; !slices.Equal(maxed, want) {
		t.Errorf("events of a lock at its maximum hold: %v, want %v", maxed, want)
	}
	var le *lease.LostError
	if len(rec.lost) != 1 || !errors.As(rec.lost[0], &le) || le.Cause != lease.MaxHold {
		t.Errorf("lost events' errors: %v, want one LostError with cause MaxHold", rec.lost)
	}

	// An observer that panics: the lock works, the panics are counted.
	before := observe.Recovered()
	p := newClient(t, pool, lease.WithObserver(func(context.Context, observe.Event) { panic("observer") }))
	pl := mustAcquire(t, p, "panicky")
	if err := pl.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if observe.Recovered() < before+2 {
		t.Errorf("recovered panics went from %d to %d, want 2 more (acquired, released)", before, observe.Recovered())
	}
}
