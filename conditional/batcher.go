package conditional

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// batcher keeps at most one statement in flight per key and combines the
// requests that arrive meanwhile into the next one.
//
// A hot row allows one commit (one disk flush) at a time, so the only way
// to sell faster is more units per commit. While a key's statement runs,
// new requests queue; the key's drainer then claims up to max of them in
// arrival order and runs them as one statement, and answers each caller only
// after that statement's outcome is known. A drainer runs only while its key
// has work, so idle keys cost nothing. With max 1 this is plain admission:
// one statement in flight per key, the rest wait their turn instead of piling
// onto the row lock.
type batcher[K comparable, R any] struct {
	max     int
	timeout time.Duration
	// run executes one statement for reqs and returns one error per request
	// (nil: granted), or a single error that fails them all.
	run func(ctx context.Context, key K, reqs []R) ([]error, error)

	mu     sync.Mutex
	queues map[K][]*call[R]
	closed bool
	wg     sync.WaitGroup
}

// A call moves from waiting to either sent (claimed by a drainer) or
// withdrawn (its caller gave up first); never both.
const (
	waiting int32 = iota
	sent
	withdrawn
)

type call[R any] struct {
	req   R
	state atomic.Int32
	err   error
	done  chan struct{}
}

func newBatcher[K comparable, R any](max int, timeout time.Duration, run func(context.Context, K, []R) ([]error, error)) *batcher[K, R] {
	return &batcher[K, R]{max: max, timeout: timeout, run: run, queues: map[K][]*call[R]{}}
}

// do submits req for key and waits for its outcome. If ctx ends before the
// request is sent, do withdraws it and returns ctx.Err(); once sent, it waits
// for the statement's outcome (bounded by the batcher's timeout), so a caller
// never gives up on a request that then succeeds.
func (b *batcher[K, R]) do(ctx context.Context, key K, req R) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := &call[R]{req: req, done: make(chan struct{})}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	q, active := b.queues[key]
	b.queues[key] = append(q, c)
	if !active {
		b.wg.Add(1)
		go b.drain(key)
	}
	b.mu.Unlock()

	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(waiting, withdrawn) {
			return ctx.Err()
		}
		<-c.done
		return c.err
	}
}

// drain runs key's statements until its queue is empty.
func (b *batcher[K, R]) drain(key K) {
	defer b.wg.Done()
	batch := make([]*call[R], 0, b.max)
	reqs := make([]R, 0, b.max)
	for {
		batch, reqs = batch[:0], reqs[:0]
		b.mu.Lock()
		q := b.queues[key]
		i := 0
		for ; i < len(q) && len(batch) < b.max; i++ {
			if q[i].state.CompareAndSwap(waiting, sent) {
				batch = append(batch, q[i])
				reqs = append(reqs, q[i].req)
			}
		}
		if len(batch) == 0 && i == len(q) {
			delete(b.queues, key)
			b.mu.Unlock()
			return
		}
		b.queues[key] = q[i:]
		b.mu.Unlock()
		if len(batch) == 0 {
			continue
		}

		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		errs, err := b.run(ctx, key, reqs)
		cancel()
		for j, c := range batch {
			if err != nil {
				c.err = err
			} else {
				c.err = errs[j]
			}
			close(c.done)
		}
	}
}

// close fails every request not yet sent with ErrClosed and waits for the
// statements in flight to finish and be answered. It is idempotent.
func (b *batcher[K, R]) close() {
	b.mu.Lock()
	b.closed = true
	for _, q := range b.queues {
		for _, c := range q {
			if c.state.CompareAndSwap(waiting, sent) {
				c.err = ErrClosed
				close(c.done)
			}
		}
	}
	b.mu.Unlock()
	b.wg.Wait()
}
