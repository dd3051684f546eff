package cas_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// queued is the function in which an Update waits while another Update
// of its key is in flight: the combiner's queue.
const queued = "internal/combine.(*Combiner[...]).Do"

// holdLeader starts an Update of key whose fn blocks until release, and
// returns once that fn runs, so that the Updates started next queue behind
// it and run as one batch.
func holdLeader[T any](t *testing.T, s *cas.Store[T], key string) (release func(), wait func()) {
	t.Helper()
	running, ch := make(chan struct{}), make(chan struct{})
	var once sync.Once
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := s.Update(context.Background(), key, func(v T) (T, error) {
			once.Do(func() { close(running); <-ch })
			return v, nil
		}); err != nil {
			t.Errorf("leader: %v", err)
		}
	}()
	select {
	case <-running:
	case <-done:
		t.Fatal("the leader's Update returned before its fn ran")
	}
	return func() { close(ch) }, func() { <-done }
}

// outcome is what one Update returned, or the value it panicked with.
type outcome[T any] struct {
	v     cas.Versioned[T]
	err   error
	panic any
}

// inOneBatch runs fns, in this order, as concurrent Updates of key that
// queue behind a held leader and so run as one batch: each is started once
// the one before it waits in the queue. Each Update's panic is recovered
// in its own goroutine. Count the Store's commits to check that the batch
// formed: the leader's and the batch's.
func inOneBatch[T any](t *testing.T, s *cas.Store[T], key string, fns ...func(T) (T, error)) []outcome[T] {
	t.Helper()
	release, wait := holdLeader(t, s, key)
	out := make([]outcome[T], len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { out[i].panic = recover() }()
			out[i].v, out[i].err = s.Update(context.Background(), key, fn)
		}()
		testenv.WaitParked(t, i+1, queued)
	}
	release()
	wait()
	wg.Wait()
	return out
}

// A fn that changes its value in place and then refuses leaves nothing
// behind: with one unit in stock, of two buyers in one batch the first
// gets it and the second is told it is sold out; the stock ends at 0, and
// the winner's result shows 0.
func TestStoreRefusedFnChangesAreNotWritten(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s, err := cas.NewStore[map[string]int](b, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Create(ctx, "stock", map[string]int{"stock": 1}); err != nil {
			t.Fatal(err)
		}
		soldOut := errors.New("sold out")
		buy := func(m map[string]int) (map[string]int, error) {
			m["stock"]--
			if m["stock"] < 0 {
				return m, soldOut
			}
			return m, nil
		}
		out := inOneBatch(t, s, "stock", buy, buy)
		won, lost := out[0], out[1]
		if got, err := s.Get(ctx, "stock"); err != nil || got.Version != 3 {
			t.Fatalf("version %d (%v), want 3 (the leader's write and the batch's): the buyers did not share a batch", got.Version, err)
		}
		if won.err != nil || !errors.Is(lost.err, soldOut) {
			t.Fatalf("buyers got %v and %v; want success, then sold out", won.err, lost.err)
		}
		if won.v.Value["stock"] != 0 || won.v.Version != 3 {
			t.Errorf("the winner got %+v, want stock 0 at version 3", won.v)
		}
		if lost.v.Version != 0 || lost.v.Value != nil {
			t.Errorf("the refused buyer got %+v, want the zero Versioned", lost.v)
		}
		if got, err := s.Get(ctx, "stock"); err != nil || got.Value["stock"] != 0 {
			t.Fatalf("stored %+v (%v), want stock 0", got, err)
		}
	})
}

// A value too large to store, or one the codec cannot encode, fails only
// the fn that produced it; the rest of its batch is written.
func TestStoreBatchBadResultFailsOnlyItsFn(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		t.Run("too large", func(t *testing.T) {
			s := newStore(t, capped{b, 1 << 10})
			if err := s.Create(ctx, "big", doc{}); err != nil {
				t.Fatal(err)
			}
			inc := func(d doc) (doc, error) { d.N++; return d, nil }
			huge := func(d doc) (doc, error) { d.Title = strings.Repeat("x", 1<<10); return d, nil }
			out := inOneBatch(t, s, "big", inc, huge, inc)
			if got, err := s.Get(ctx, "big"); err != nil || got.Version != 3 {
				t.Fatalf("version %d (%v), want 3 (two writes): the batch did not form", got.Version, err)
			}
			if out[0].err != nil || !errors.Is(out[1].err, cas.ErrTooLarge) || out[2].err != nil {
				t.Fatalf("errors %v, %v, %v; want nil, ErrTooLarge, nil", out[0].err, out[1].err, out[2].err)
			}
			if out[0].v.Value.N != 1 || out[1].v.Version != 0 || out[2].v.Value.N != 2 {
				t.Errorf("results %+v, %+v, %+v; want N 1, nothing, N 2", out[0].v, out[1].v, out[2].v)
			}
			if got, err := s.Get(ctx, "big"); err != nil || got.Value.N != 2 || got.Value.Title != "" {
				t.Fatalf("stored N=%d, title of %d bytes (%v); want N 2, no title", got.Value.N, len(got.Value.Title), err)
			}
		})
		t.Run("unencodable", func(t *testing.T) {
			s, err := cas.NewStore[map[string]float64](b, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if err := s.Create(ctx, "floats", map[string]float64{"n": 0}); err != nil {
				t.Fatal(err)
			}
			inc := func(m map[string]float64) (map[string]float64, error) { m["n"]++; return m, nil }
			nan := func(m map[string]float64) (map[string]float64, error) { m["n"] = math.NaN(); return m, nil }
			out := inOneBatch(t, s, "floats", inc, nan, inc)
			if out[0].err != nil || out[1].err == nil || out[2].err != nil {
				t.Fatalf("errors %v, %v, %v; want nil, an encode error, nil", out[0].err, out[1].err, out[2].err)
			}
			if got, err := s.Get(ctx, "floats"); err != nil || got.Value["n"] != 2 {
				t.Fatalf("stored %v (%v), want n 2", got.Value, err)
			}
		})
	})
}

// capped is a backend that takes smaller values, so that a test can
// exceed its limit cheaply.
type capped struct {
	cas.Backend
	max int
}

func (c capped) MaxValue() int { return c.max }

var errBoom = errors.New("boom")

// A panic in one fn of a batch reaches that fn's caller, in its own
// goroutine, with the value it panicked with, and no other goroutine (the
// process does not crash); the others of the batch are written and
// answered. The NoCoalescing path re-raises the same way.
func TestStoreFnPanicReachesItsCaller(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s := newStore(t, b)
		if err := s.Create(ctx, "p", doc{}); err != nil {
			t.Fatal(err)
		}
		inc := func(d doc) (doc, error) { d.N++; return d, nil }
		boom := func(d doc) (doc, error) { d.N += 100; panic(errBoom) }
		out := inOneBatch(t, s, "p", inc, boom, inc)
		if got, err := s.Get(ctx, "p"); err != nil || got.Version != 3 {
			t.Fatalf("version %d (%v), want 3 (two writes): the batch did not form", got.Version, err)
		}
		if out[1].panic != errBoom {
			t.Fatalf("the panicking caller recovered %v (err %v), want errBoom", out[1].panic, out[1].err)
		}
		for _, i := range []int{0, 2} {
			if out[i].panic != nil || out[i].err != nil {
				t.Errorf("caller %d: panic %v, err %v; want success", i, out[i].panic, out[i].err)
			}
		}
		if got, err := s.Get(ctx, "p"); err != nil || got.Value.N != 2 {
			t.Fatalf("stored N=%d (%v), want 2", got.Value.N, err)
		}

		var p any
		func() {
			defer func() { p = recover() }()
			s.Update(ctx, "p", boom, cas.NoCoalescing())
		}()
		if p != errBoom {
			t.Fatalf("NoCoalescing: recovered %v, want errBoom", p)
		}
		if got, err := s.Update(ctx, "p", inc); err != nil || got.Value.N != 3 {
			t.Fatalf("Update after the panics: %+v, %v; want N 3", got, err)
		}
	})
}

// A combined Update whose caller gives up while its batch retries
// conflicts returns the context's error at the next retry, while the
// batch's other caller still waits, and its fn's change is not written;
// an Update of the same batch whose caller waits still succeeds.
func TestStoreCombinedUpdateHonoursCtxWhileRetrying(t *testing.T) {
	conformance(t, func(t *testing.T, b cas.Backend) {
		ctx := context.Background()
		s := newStore(t, b, cas.WithAttempts(10000), cas.WithBackoff(5*time.Millisecond, 20*time.Millisecond))
		other := newStore(t, b)
		if err := s.Create(ctx, "c", doc{}); err != nil {
			t.Fatal(err)
		}
		// The impatient caller's fn moves the version on behind the batch's
		// back, so every attempt of a batch that holds it conflicts.
		var runs atomic.Int64
		impatient := func(d doc) (doc, error) {
			runs.Add(1)
			if _, err := other.Update(context.Background(), "c", func(d doc) (doc, error) {
				d.Edits = append(d.Edits, "bump")
				return d, nil
			}); err != nil {
				return d, err
			}
			d.N += 100
			return d, nil
		}
		inc := func(d doc) (doc, error) { d.N++; return d, nil }

		release, wait := holdLeader(t, s, "c")
		defer wait()
		type answer struct {
			err  error
			took time.Duration
		}
		gaveUp, waited := make(chan answer, 1), make(chan answer, 1)
		start := time.Now()
		// The impatient caller leaves once its fn has run and conflicted
		// a few times: while the batch is retrying.
		impatientCtx, leave := context.WithCancel(ctx)
		defer leave()
		go func() {
			_, err := s.Update(impatientCtx, "c", impatient)
			gaveUp <- answer{err, time.Since(start)}
		}()
		go func() {
			if testenv.Poll("the impatient fn ran 3 times", func() (bool, error) { return runs.Load() >= 3, nil }) == nil {
				leave()
			}
		}()
		testenv.WaitParked(t, 1, queued)
		go func() {
			_, err := s.Update(ctx, "c", inc)
			waited <- answer{err, time.Since(start)}
		}()
		testenv.WaitParked(t, 2, queued)
		release()
		for _, w := range []struct {
			name string
			ch   chan answer
			want error
		}{{"impatient", gaveUp, context.Canceled}, {"patient", waited, nil}} {
			select {
			case a := <-w.ch:
				if !errors.Is(a.err, w.want) && (w.want != nil || a.err != nil) {
					t.Errorf("%s caller: %v after %v, want %v", w.name, a.err, a.took, w.want)
				}
				t.Logf("%s caller: %v after %v", w.name, a.err, a.took)
			case <-time.After(20 * time.Second): // a guard against a hang, not a measure
				t.Fatalf("%s caller: no answer within 20 s", w.name)
			}
		}
		got, err := s.Get(ctx, "c")
		if err != nil || got.Value.N != 1 || len(got.Value.Edits) == 0 {
			t.Fatalf("stored N=%d after %d bumps (%v); want N 1 (the patient increment only) and some bumps", got.Value.N, len(got.Value.Edits), err)
		}
	})
}

// ambiguousPuts lets the first Put through and reports every later one as
// ErrAmbiguousCommit without sending it.
type ambiguousPuts struct {
	cas.Backend
	puts atomic.Int64
}

func (a *ambiguousPuts) Put(ctx context.Context, key string, v []byte, version int64) (int64, error) {
	if a.puts.Add(1) == 1 {
		return a.Backend.Put(ctx, key, v, version)
	}
	return 0, cas.ErrAmbiguousCommit
}

// When a batch's write fails for all, a fn that failed on its own keeps
// its own answer: its error, or its panic raised in its caller. Only the
// fns that were in the write are told ErrAmbiguousCommit.
func TestStoreFailedBatchKeepsEachFnsOwnFailure(t *testing.T) {
	t.Parallel()
	b, err := pgcas.NewBackend(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, &ambiguousPuts{Backend: b})
	if err := s.Create(context.Background(), "d", doc{}); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused")
	out := inOneBatch(t, s, "d",
		func(d doc) (doc, error) { d.N++; return d, nil },
		func(doc) (doc, error) { panic("boom") },
		func(d doc) (doc, error) { return d, refused })
	if !errors.Is(out[0].err, cas.ErrAmbiguousCommit) || out[1].panic != "boom" || !errors.Is(out[2].err, refused) {
		t.Fatalf("outcomes %+v, %+v, %+v; want ErrAmbiguousCommit, the panic, the fn's own error", out[0], out[1], out[2])
	}
}
