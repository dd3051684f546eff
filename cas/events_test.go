package cas_test

import (
	"context"
	"sync"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/observe"
)

// events records what a Store or Retry reports to its observer: a count
// per event name, and the errors of EventRetry. A Store's events arrive
// from its own goroutine; read them after Close, which delivers them all.
type events struct {
	mu      sync.Mutex
	n       map[string]int
	retries []error
}

func (e *events) observer() cas.Option {
	return cas.WithObserver(observe.Func(func(_ context.Context, ev observe.Event) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.n == nil {
			e.n = map[string]int{}
		}
		e.n[ev.Name]++
		if ev.Name == cas.EventRetry {
			e.retries = append(e.retries, ev.Err)
		}
	}))
}

func (e *events) count(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[name]
}

func (e *events) retried() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.retries...)
}
