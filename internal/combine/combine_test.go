package combine

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errClosed = errors.New("closed")

// gate is a Run that records each batch and blocks until released.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	release chan struct{}
	started chan struct{}
}

func newGate() *gate { return &gate{release: make(chan struct{}), started: make(chan struct{}, 100)} }

func (g *gate) run(_ context.Context, key string, reqs []int) ([]string, []error, error) {
	g.mu.Lock()
	g.batches = append(g.batches, slices.Clone(reqs))
	g.mu.Unlock()
	g.started <- struct{}{}
	<-g.release
	res, errs := make([]string, len(reqs)), make([]error, len(reqs))
	for i, r := range reqs {
		res[i] = fmt.Sprintf("%s:%d", key, r)
		if r < 0 {
			errs[i] = fmt.Errorf("refused %d", r)
		}
	}
	return res, errs, nil
}

func TestCombinesWhileInFlightAndAnswersEachCaller(t *testing.T) {
	g := newGate()
	c := New(3, errClosed, g.run)
	defer c.Close()
	type out struct {
		res string
		err error
	}
	outs := make([]chan out, 6)
	submit := func(i, req int) {
		outs[i] = make(chan out, 1)
		go func() { r, err := c.Do(context.Background(), "k", req); outs[i] <- out{r, err} }()
	}
	submit(0, 10)
	<-g.started // the first request runs alone
	for i, req := range []int{11, -12, 13, 14, 15} {
		submit(i+1, req)
		for queued(c, "k") < i+1 { // keep arrival order: each waits in the queue before the next comes
			runtime.Gosched()
		}
	}
	close(g.release)
	for i, want := range []string{"k:10", "k:11", "k:-12", "k:13", "k:14", "k:15"} {
		o := <-outs[i]
		if o.res != want {
			t.Errorf("caller %d got %q, want %q", i, o.res, want)
		}
		if (o.err != nil) != (i == 2) {
			t.Errorf("caller %d: err %v", i, o.err)
		}
	}
	if want := [][]int{{10}, {11, -12, 13}, {14, 15}}; !slices.EqualFunc(g.batches, want, slices.Equal) {
		t.Fatalf("batches %v, want %v (one in flight, then at most 3 in arrival order)", g.batches, want)
	}
}

func TestWithdrawnRequestIsNeverSent(t *testing.T) {
	g := newGate()
	c := New(10, errClosed, g.run)
	defer c.Close()
	first := make(chan error, 1)
	go func() { _, err := c.Do(context.Background(), "k", 1); first <- err }()
	<-g.started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Do(ctx, "k", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued request whose context ended: %v", err)
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	c.Close()
	if len(g.batches) != 1 {
		t.Fatalf("batches %v: the withdrawn request was sent", g.batches)
	}
}

func TestCloseFailsQueuedAndWaitsForInFlight(t *testing.T) {
	g := newGate()
	c := New(10, errClosed, g.run)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.Do(context.Background(), "k", 1); first <- err }()
	<-g.started
	go func() { _, err := c.Do(context.Background(), "k", 2); second <- err }()
	time.Sleep(20 * time.Millisecond)
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	if err := <-second; !errors.Is(err, errClosed) {
		t.Fatalf("queued request at Close: %v", err)
	}
	select {
	case <-closed:
		t.Fatal("Close returned with an operation in flight")
	case <-time.After(20 * time.Millisecond):
	}
	close(g.release)
	<-closed
	if err := <-first; err != nil {
		t.Fatalf("in-flight request at Close: %v", err)
	}
	if _, err := c.Do(context.Background(), "k", 3); !errors.Is(err, errClosed) {
		t.Fatalf("request after Close: %v", err)
	}
}

func TestBatchErrorFailsEveryRequestOfTheBatch(t *testing.T) {
	boom := errors.New("connection lost")
	c := New(10, errClosed, func(context.Context, string, []int) ([]string, []error, error) {
		return nil, nil, boom
	})
	defer c.Close()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Do(context.Background(), "k", i); !errors.Is(err, boom) {
				t.Errorf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
}

// A panicking operation run inline reaches its caller; the requests queued
// behind it are still served, and the Combiner still closes.
func TestPanicReachesTheInlineCallerAndTheKeyGoesOn(t *testing.T) {
	g := newGate()
	run := func(ctx context.Context, key string, reqs []int) ([]string, []error, error) {
		if slices.Contains(reqs, -1) {
			g.started <- struct{}{}
			<-g.release
			panic("boom")
		}
		return g.run(ctx, key, reqs)
	}
	c := New(4, errClosed, run)
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		c.Do(context.Background(), "k", -1)
	}()
	<-g.started
	queued := make(chan error, 1)
	go func() {
		r, err := c.Do(context.Background(), "k", 5)
		if err == nil && r != "k:5" {
			err = fmt.Errorf("got %q", r)
		}
		queued <- err
	}()
	time.Sleep(20 * time.Millisecond)
	g.release <- struct{}{} // the panicking batch
	if p := <-panicked; p != "boom" {
		t.Fatalf("the inline caller recovered %v, want the operation's panic", p)
	}
	<-g.started // the queued request's batch, on a new drainer
	close(g.release)
	if err := <-queued; err != nil {
		t.Fatalf("request queued behind the panic: %v", err)
	}
	if r, err := c.Do(context.Background(), "k", 6); err != nil || r != "k:6" {
		t.Fatalf("after the panic: %q, %v", r, err)
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after a panic")
	}
}

// queued returns how many requests for key wait in c's queue.
func queued[K comparable, Req, Res any](c *Combiner[K, Req, Res], key K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queues[key])
}

// An operation runs while any caller of its batch waits, with no caller's
// values, and ends once every one of them has given up; each caller still
// gets the operation's outcome.
func TestOperationEndsWhenEveryCallerGaveUp(t *testing.T) {
	type ctxKey struct{}
	ops := make(chan context.Context, 2)
	c := New(10, errClosed, func(ctx context.Context, _ string, reqs []int) ([]string, []error, error) {
		ops <- ctx
		<-ctx.Done()
		return nil, nil, ctx.Err()
	})
	defer c.Close()
	var ctxs [3]context.Context
	var cancels [3]context.CancelFunc
	errs := make(chan error, 3)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(context.WithValue(context.Background(), ctxKey{}, i))
		defer cancels[i]()
		go func() { _, err := c.Do(ctxs[i], "k", i); errs <- err }()
		if i == 0 {
			<-ops // the first request runs alone; the others queue behind it
		}
		for c.queued("k") < i {
			runtime.Gosched()
		}
	}
	cancels[0]()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller of an operation cut by its own ctx: %v", err)
	}
	op := <-ops // requests 1 and 2, one batch
	if v := op.Value(ctxKey{}); v != nil {
		t.Fatalf("the batch's operation carries a caller's value %v", v)
	}
	cancels[1]()
	select {
	case <-op.Done():
		t.Fatal("the operation ended while a caller of its batch still waits")
	case <-time.After(20 * time.Millisecond):
	}
	cancels[2]()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("caller of an operation every caller gave up on: %v", err)
		}
	}
}

// A caller whose ctx can never end never gives up: its batch's operation
// runs under a ctx that never ends (and Committer commits it inline),
// while a batch of callers who all may give up gets one that ends.
func TestOperationOfACallerWhoNeverGivesUpNeverEnds(t *testing.T) {
	ops := make(chan context.Context, 2)
	release := make(chan struct{})
	c := New(10, errClosed, func(ctx context.Context, _ string, reqs []int) ([]string, []error, error) {
		ops <- ctx
		<-release
		return make([]string, len(reqs)), make([]error, len(reqs)), nil
	})
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	go func() { _, err := c.Do(ctx, "k", 0); errs <- err }()
	if op := <-ops; op.Done() == nil {
		t.Fatal("the operation of a caller who may give up can never end")
	}
	go func() { _, err := c.Do(ctx, "k", 1); errs <- err }()
	go func() { _, err := c.Do(context.Background(), "k", 2); errs <- err }()
	for c.queued("k") < 2 {
		runtime.Gosched()
	}
	release <- struct{}{}
	if op := <-ops; op.Done() != nil {
		t.Fatal("the operation of a batch with a caller who never gives up can end")
	}
	release <- struct{}{}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// A Run may keep its reqs after returning: the next batch of the key gets
// a slice of its own.
func TestRunOwnsItsRequests(t *testing.T) {
	type op struct {
		reqs, copied []int
		release      chan struct{}
	}
	ops := make(chan op)
	c := New(10, errClosed, func(_ context.Context, _ string, reqs []int) ([]string, []error, error) {
		o := op{reqs, slices.Clone(reqs), make(chan struct{})}
		ops <- o
		<-o.release
		return make([]string, len(reqs)), make([]error, len(reqs)), nil
	})
	defer c.Close()
	var wg sync.WaitGroup
	submit := func(reqs ...int) {
		for _, r := range reqs {
			n := c.queued("k")
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = c.Do(context.Background(), "k", r) }()
			for c.queued("k") == n { // in order: each queued before the next
				runtime.Gosched()
			}
		}
	}
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = c.Do(context.Background(), "k", 1) }()
	var kept []op
	o := <-ops // [1], inline
	kept = append(kept, o)
	submit(2, 3)
	close(o.release)
	o = <-ops // [2 3], on a drainer
	kept = append(kept, o)
	submit(4, 5)
	close(o.release)
	o = <-ops // [4 5], on the same drainer
	kept = append(kept, o)
	close(o.release)
	wg.Wait()
	for _, o := range kept {
		if !slices.Equal(o.reqs, o.copied) {
			t.Fatalf("a Run's reqs changed after it returned: %v, was %v", o.reqs, o.copied)
		}
	}
}
