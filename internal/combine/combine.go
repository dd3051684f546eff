// Package combine keeps at most one operation in flight per key and
// combines the requests that arrive meanwhile into the next one.
//
// A hot database row allows one commit (one disk flush) at a time, so the
// only way to go faster is more requests per commit. While a key's
// operation runs, new requests for that key queue; the key's drainer then
// claims up to max of them in arrival order, runs them as one operation,
// and answers each caller only after that operation's outcome is known.
// A drainer runs only while its key has work, so idle keys cost nothing.
// With max 1 this is plain admission: one operation in flight per key, the
// rest wait their turn instead of piling onto the row lock.
//
// This is flat combining (Hendler, Incze, Shavit, Tzafrir, SPAA 2010) with
// the combiner elected per key. conditional coalesces takes with it; cas
// combines read-modify-writes.
package combine

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/nolock/nolock/internal/errfmt"
)

// Run executes one operation for a batch of requests of one key. It
// returns one result and one error per request, or a single error that
// fails them all. reqs is the Run's own: it may keep it after returning
// (a write that outlives its wait still encodes it).
type Run[K comparable, Req, Res any] func(ctx context.Context, key K, reqs []Req) ([]Res, []error, error)

// Combiner is safe for concurrent use.
type Combiner[K comparable, Req, Res any] struct {
	max       int
	run       Run[K, Req, Res]
	errClosed error

	mu     sync.Mutex
	queues map[K][]*call[Req, Res]
	closed bool
	wg     sync.WaitGroup
}

// A call moves from waiting to either sent (claimed by a drainer) or
// withdrawn (its caller gave up first), never both; a sent call becomes
// answered when its outcome is known.
const (
	waiting int32 = iota
	sent
	withdrawn
	answered // sent, and its outcome is in res and err
)

type call[Req, Res any] struct {
	ctx   context.Context
	req   Req
	state atomic.Int32
	res   Res
	err   error
	done  chan struct{}
}

// New returns a Combiner that runs at most max requests per operation.
// errClosed is what requests get once the Combiner is closed.
func New[K comparable, Req, Res any](max int, errClosed error, run Run[K, Req, Res]) *Combiner[K, Req, Res] {
	return &Combiner[K, Req, Res]{max: max, run: run, errClosed: errClosed, queues: map[K][]*call[Req, Res]{}}
}

// Do submits req for key and waits for its outcome. If ctx ends before the
// request is sent, Do withdraws it and returns ctx.Err(); once sent, it
// waits for the operation's outcome, so a caller never gives up on a
// request that then succeeds. The operation's ctx carries no caller's
// values (the batch is no one caller's) and ends only when every caller of
// its batch has given up (its ctx ended): a slow service alone never cuts
// an operation short, and an operation nobody waits for does not run on.
//
// The first request for an idle key runs the operation in Do's own
// goroutine (no goroutine switch when there is no contention); a panic in
// the operation then reaches that caller, after the batch's other callers
// have been answered with an error and the key handed on.
func (c *Combiner[K, Req, Res]) Do(ctx context.Context, key K, req Req) (Res, error) {
	var zero Res
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	cl := &call[Req, Res]{ctx: ctx, req: req, done: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return zero, c.errClosed
	}
	q, active := c.queues[key]
	c.queues[key] = append(q, cl)
	if !active {
		// No operation in flight for key: this caller runs it, without a
		// goroutine switch on the uncontended path, and hands any requests
		// that arrived meanwhile to a drainer goroutine.
		c.wg.Add(1)
		c.mu.Unlock()
		c.drain(key, cl)
		return cl.res, cl.err
	}
	c.mu.Unlock()

	select {
	case <-cl.done:
		return cl.res, cl.err
	case <-ctx.Done():
		if cl.state.CompareAndSwap(waiting, withdrawn) {
			return zero, ctx.Err()
		}
		<-cl.done
		return cl.res, cl.err
	}
}

// drain runs key's operations until its queue is empty. A caller draining
// inline (own != nil) returns as soon as its own request is answered,
// leaving the rest of the queue to a new drainer goroutine.
func (c *Combiner[K, Req, Res]) drain(key K, own *call[Req, Res]) {
	var batch []*call[Req, Res] // grown on demand: an uncontended key allocates little
	for {
		batch = batch[:0]
		var reqs []Req // never reused: see Run
		c.mu.Lock()
		q := c.queues[key]
		if len(q) == 0 || own != nil && own.state.Load() == answered {
			c.mu.Unlock()
			c.release(key)
			return
		}
		i := 0
		for ; i < len(q) && len(batch) < c.max; i++ {
			if q[i].state.CompareAndSwap(waiting, sent) {
				batch = append(batch, q[i])
				reqs = append(reqs, q[i].req)
			}
		}
		c.queues[key] = q[i:]
		c.mu.Unlock()
		if len(batch) > 0 {
			c.operate(key, batch, reqs)
			if own == nil {
				// A drainer lets the callers it just answered run first:
				// those that come straight back join the next batch
				// instead of the one after it. The scheduler now and then
				// runs a yielding goroutine before the ones it woke, so a
				// drainer that finds fewer back than it answered yields
				// once more.
				runtime.Gosched()
				if c.queued(key) < len(batch) {
					runtime.Gosched()
				}
			}
		}
	}
}

// queued returns how many requests wait in key's queue.
func (c *Combiner[K, Req, Res]) queued(key K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queues[key])
}

// operate runs one operation and answers each caller of its batch. If the
// operation panics (or exits its goroutine), every caller of the batch
// gets an error, the key goes to a new drainer, and the panic goes on up
// this goroutine: the inline caller's, or a drainer goroutine's.
func (c *Combiner[K, Req, Res]) operate(key K, batch []*call[Req, Res], reqs []Req) {
	done := false
	defer func() {
		if done {
			return
		}
		p := recover()
		err := errfmt.Errorf("combine: the operation panicked: %v", p)
		for _, cl := range batch {
			cl.err = err
			cl.state.Store(answered)
			close(cl.done)
		}
		c.release(key)
		if p != nil {
			panic(p)
		}
	}()
	ctx, stop := operationContext(batch)
	defer stop()
	res, errs, err := c.run(ctx, key, reqs)
	for j, cl := range batch {
		if err != nil {
			cl.err = err
		} else {
			cl.res, cl.err = res[j], errs[j]
		}
		cl.state.Store(answered)
		close(cl.done)
	}
	done = true
}

// release ends a drainer: a new drainer goroutine takes over key's queue
// (inheriting the drainer's WaitGroup count), or, if the queue is empty,
// the key goes idle.
func (c *Combiner[K, Req, Res]) release(key K) {
	c.mu.Lock()
	if len(c.queues[key]) > 0 {
		c.mu.Unlock()
		go c.drain(key, nil)
		return
	}
	delete(c.queues, key)
	c.mu.Unlock()
	c.wg.Done()
}

// Close fails every request not yet sent with errClosed and waits for the
// operations in flight to finish and be answered (each ends, at the
// latest, when its callers have all given up). It is idempotent.
func (c *Combiner[K, Req, Res]) Close() {
	c.mu.Lock()
	c.closed = true
	for _, q := range c.queues {
		for _, cl := range q {
			if cl.state.CompareAndSwap(waiting, sent) {
				cl.err = c.errClosed
				close(cl.done)
			}
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// operationContext returns the context of one operation for batch (see
// Do): done once every caller's ctx is done. stop releases it. A caller
// whose ctx can never end (context.Background) never gives up, so the
// operation's ctx then never ends either: it is context.Background, and
// nothing watches the others.
func operationContext[Req, Res any](batch []*call[Req, Res]) (ctx context.Context, stop func()) {
	for _, cl := range batch {
		if cl.ctx.Done() == nil {
			return context.Background(), func() {}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var left atomic.Int32
	left.Store(int32(len(batch)))
	unwatch := make([]func() bool, len(batch))
	for i, cl := range batch {
		unwatch[i] = context.AfterFunc(cl.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, u := range unwatch {
			u()
		}
		cancel()
	}
}
