package testenv

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/condcore"
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

// WantNames checks the names of each key's events so far against want.
func (r *Events) WantNames(t testing.TB, want map[string][]string) {
	t.Helper()
	for key, w := range want {
		if got := r.Names(key); !slices.Equal(got, w) {
			t.Errorf("events of %q: %v, want %v", key, got, w)
		}
	}
}

// Holds is what both backends' Holds have in common, for HoldsEvents.
type Holds interface {
	Add(ctx context.Context, resources ...string) error
	Hold(ctx context.Context, resource, holder string, ttl time.Duration) (time.Time, error)
	HoldAll(ctx context.Context, resources []string, holder string, ttl time.Duration) (time.Time, error)
	Confirm(ctx context.Context, resource, holder string) error
	Release(ctx context.Context, resource, holder string) error
}

// HoldsEvents provokes each event of a Holds whose observer is r's (held,
// refused for each reason, confirmed, released, failed, for Hold and
// HoldAll) and checks their names, keys, N, Duration and errors.
func (r *Events) HoldsEvents(t testing.TB, h Holds) {
	t.Helper()
	ctx := context.Background()
	step := func(err error, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Fatalf("err = %v, want %v", err, want)
		}
	}
	hold := func(resource, holder string) error { _, err := h.Hold(ctx, resource, holder, time.Minute); return err }
	holdAll := func(holder string) error {
		_, err := h.HoldAll(ctx, []string{"c", "b"}, holder, time.Minute)
		return err
	}
	step(h.Add(ctx, "a", "b", "c"), nil)
	step(hold("a", "alice"), nil)
	step(hold("a", "bob"), condcore.ErrHeld)
	step(h.Confirm(ctx, "a", "bob"), condcore.ErrNotHolder)
	step(h.Confirm(ctx, "a", "alice"), nil)
	step(hold("a", "bob"), condcore.ErrConfirmed)
	step(hold("nope", "bob"), condcore.ErrNotFound)
	step(holdAll("bob"), nil)
	step(holdAll("carol"), condcore.ErrHeld)
	step(h.Release(ctx, "b", "bob"), nil)
	step(h.Release(ctx, "b", "bob"), condcore.ErrNotHolder)

	r.WantNames(t, map[string][]string{
		"a":    {"conditional.held", "conditional.refused", "conditional.refused", "conditional.confirmed", "conditional.refused"},
		"nope": {"conditional.failed"},
		"b,c":  {"conditional.held", "conditional.refused"},
		"b":    {"conditional.released", "conditional.refused"},
	})
	for key, n := range map[string]int64{"a": 1, "b,c": 2} {
		for _, e := range r.Of(key, "conditional.held") {
			if e.N != n || e.Duration <= 0 {
				t.Errorf("%q held: N %d, Duration %v; want %d and > 0", key, e.N, e.Duration, n)
			}
		}
	}
	errs := r.Errs("a", "conditional.refused")
	if len(errs) != 3 || !errors.Is(errs[0], condcore.ErrHeld) || !errors.Is(errs[1], condcore.ErrNotHolder) || !errors.Is(errs[2], condcore.ErrConfirmed) {
		t.Errorf("refusals of a: %v, want ErrHeld, ErrNotHolder, ErrConfirmed", errs)
	}
	if errs := r.Errs("b,c", "conditional.refused"); len(errs) != 1 || !errors.Is(errs[0], condcore.ErrHeld) {
		t.Errorf("HoldAll's refusal: %v, want ErrHeld", errs)
	}
}

// Panicky is an observe.Observer for tests that panics on every other
// event it gets (the first, the third, ...) and adds up the Dropped counts
// of the others: each panic must reach a later event of the same nolock
// value as a count in its Dropped field (see observe.Guard).
type Panicky struct {
	calls, panics, dropped atomic.Int64
}

// Observe is the Observer to pass to a package's WithObserver.
func (p *Panicky) Observe(_ context.Context, e observe.Event) {
	if p.calls.Add(1)%2 == 1 {
		p.panics.Add(1)
		panic("testenv: a panicking observer")
	}
	p.dropped.Add(e.Dropped)
}

// Check fails t unless Observe panicked at least min times, and every
// panic was counted in a later event's Dropped, but for at most one per
// value sharing the observer (values of them: a value's last panic has no
// later event to carry it), and nothing more was counted.
func (p *Panicky) Check(t testing.TB, values, min int) {
	t.Helper()
	panics, dropped := p.panics.Load(), p.dropped.Load()
	if panics < int64(min) || dropped > panics || dropped < panics-int64(values) {
		t.Errorf("observer panicked %d times (want at least %d), and later events counted %d of them in Dropped (want all but at most %d)",
			panics, min, dropped, values)
	}
}
