// Package notify delivers observe.Events from background goroutines
// without waiting for the observer.
package notify

import (
	"context"
	"sync"

	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Queue hands events to an observer on a goroutine of its own, in order,
// started by the first event (a Queue that never gets one costs no
// goroutine). Notify never blocks: when size events are already waiting,
// the event is dropped, and the next one delivered carries the count in
// Dropped. A nil *Queue (from New with a nil observer) does nothing.
type Queue struct {
	o       observe.Observer
	ch      chan item
	mu      sync.Mutex
	dropped int64
	started bool
	closed  bool
	done    chan struct{}
}

type item struct {
	ctx context.Context
	e   observe.Event
}

// New returns a Queue for o, or nil when o is nil.
func New(o observe.Observer, size int) *Queue {
	if o == nil {
		return nil
	}
	return &Queue{o: o, ch: make(chan item, size), done: make(chan struct{})}
}

func (q *Queue) run() {
	defer close(q.done)
	for it := range q.ch {
		observed.Event(q.o, it.ctx, it.e)
	}
}

// Notify queues e, or drops it when the queue is full or closed.
func (q *Queue) Notify(ctx context.Context, e observe.Event) {
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if !q.started {
		q.started = true
		go q.run()
	}
	e.Dropped = q.dropped
	select {
	case q.ch <- item{context.WithoutCancel(ctx), e}:
		q.dropped = 0
	default:
		q.dropped++
	}
}

// Close stops taking events and returns once the queued ones are
// delivered. It is idempotent.
func (q *Queue) Close() {
	if q == nil {
		return
	}
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		close(q.ch)
		if !q.started {
			close(q.done) // no goroutine, no events
		}
	}
	q.mu.Unlock()
	<-q.done
}

// waiting returns how many events wait in the queue.
func (q *Queue) waiting() int { return len(q.ch) }
