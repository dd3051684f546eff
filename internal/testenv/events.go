package testenv

import (
	"context"
	"slices"
	"sync"

	"github.com/nolock/nolock/observe"
)

// Events is an observe.Observer for tests: it keeps every event, by Key.
type Events struct {
	mu    sync.Mutex
	byKey map[string][]observe.Event
}

// Observe is the Observer to pass to a package's WithObserver.
func (r *Events) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string][]observe.Event{}
	}
	r.byKey[e.Key] = append(r.byKey[e.Key], e)
}

// Names returns the names of key's events so far, in order.
func (r *Events) Names(key string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, len(r.byKey[key]))
	for i, e := range r.byKey[key] {
		names[i] = e.Name
	}
	return names
}

// Errs returns the errors of key's events named name, in order.
func (r *Events) Errs(key, name string) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, e := range r.byKey[key] {
		if e.Name == name {
			errs = append(errs, e.Err)
		}
	}
	return slices.Clip(errs)
}

// Of returns key's events named name, in order.
func (r *Events) Of(key, name string) []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []observe.Event
	for _, e := range r.byKey[key] {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}
