package conditional_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Each take's outcome reaches the observer: 40 concurrent takes of one
// unit from 30 give 30 granted and 10 refused events, none failed.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	s := newStock(t, pool, conditional.WithObserver(observe.Func(events.Observe)))
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
	if g, r := count(conditional.EventGranted), count(conditional.EventRefused); g != 30 || r != takes-30 {
		t.Errorf("%d granted and %d refused events, want 30 and %d (events: %v)", g, r, takes-30, names)
	}
	if f := count(conditional.EventFailed); f != 0 {
		t.Errorf("%d failed events, want 0", f)
	}
	var batched int64
	for _, e := range events.Of("sku#0", conditional.EventBatch) { // the key's one bucket
		batched += e.N
	}
	if batched > takes {
		t.Errorf("batch events carry %d takes of %d", batched, takes)
	}
	t.Logf("%d coalesced statements carried %d of the %d takes", len(events.Of("sku#0", conditional.EventBatch)), batched, takes)
}

// A debit the balance cannot cover is refused with ErrInsufficient, to
// the caller and in its event alike.
func TestObserverAccounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	a, err := conditional.NewAccounts(pool, conditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "wallet", 10); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "wallet", 4); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "wallet", 15); !errors.Is(err, conditional.ErrInsufficient) {
		t.Fatalf("a debit past the balance: %v, want ErrInsufficient", err)
	}
	if got := events.Names("wallet"); !slices.Equal(got, []string{conditional.EventGranted, conditional.EventRefused}) {
		t.Errorf("events %v, want granted then refused", got)
	}
	if errs := events.Errs("wallet", conditional.EventRefused); len(errs) != 1 || !errors.Is(errs[0], conditional.ErrInsufficient) {
		t.Errorf("refused event's error %v, want ErrInsufficient", errs)
	}
}

// The endgame's gather is reported with the units it left in bucket 0:
// 8 units over 4 buckets (2 each), endgame 10, a take of 3 that no bucket
// covers gathers the other 5.
func TestObserverGathered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	s := newStock(t, pool, conditional.WithBuckets(4), conditional.WithEndgame(10), conditional.WithObserver(observe.Func(events.Observe)))
	if err := s.Put(ctx, "sku", 8); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, "sku", 3); err != nil {
		t.Fatal(err)
	}
	if g := events.Of("sku", conditional.EventGathered); len(g) != 1 || g[0].N != 5 {
		t.Errorf("gathered events %+v, want one with N 5", g)
	}
}

// An observer that blocks on the events a key's drainer sends holds up
// nothing: concurrent takes all end while it blocks, and Close delivers
// what was queued once it lets go.
func TestObserverBlockingHoldsNothingUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	release := make(chan struct{})
	var batches atomic.Int64
	s, err := conditional.NewStock(pool, conditional.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == conditional.EventBatch {
			<-release
			batches.Add(1)
		}
	})))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "sku", 100); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() { _ = s.Take(ctx, "sku", 1) })
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(testenv.Scale(30 * time.Second)):
		t.Fatal("takes stalled behind an observer that blocks")
	}
	if n, err := s.Available(ctx, "sku"); err != nil || n != 36 {
		t.Errorf("available after 64 takes of 100: %d, %v; want 36", n, err)
	}
	close(release)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d batch events delivered after the observer let go", batches.Load())
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{conditional.EventGranted, "conditional.granted"},
		{conditional.EventRefused, "conditional.refused"},
		{conditional.EventFailed, "conditional.failed"},
		{conditional.EventBatch, "conditional.batch"},
		{conditional.EventGathered, "conditional.gathered"},
		{conditional.EventHeld, "conditional.held"},
		{conditional.EventConfirmed, "conditional.confirmed"},
		{conditional.EventReleased, "conditional.released"},
		{conditional.EventWritten, "conditional.written"},
		{conditional.EventFenced, "conditional.fenced"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
