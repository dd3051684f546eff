package testenv

import (
	"context"
	"sync"
	"testing"

	"github.com/nolock/nolock/observe"
)

// Calls is an observe.Observer for tests of the calls' contract: its
// Start puts the call's number in the context it returns; End checks that
// it got that context, once per Start. Safe for concurrent use.
type Calls struct {
	mu     sync.Mutex
	starts []observe.Call
	ends   map[int][]observe.Event // by call number
	events []bool                  // per Event: whether its ctx came from a Start
	bad    []string
}

type callKey struct{}

// CallOf returns the number of the call whose Start made ctx (from 1).
func CallOf(ctx context.Context) (int, bool) {
	n, ok := ctx.Value(callKey{}).(int)
	return n, ok
}

// Start records c and returns ctx with its number.
func (r *Calls) Start(ctx context.Context, c observe.Call) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, c)
	return context.WithValue(ctx, callKey{}, len(r.starts))
}

// End records e under the call of ctx.
func (r *Calls) End(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := CallOf(ctx)
	if !ok {
		r.bad = append(r.bad, "End "+e.Name+" without a Start's ctx")
		return
	}
	if r.ends == nil {
		r.ends = map[int][]observe.Event{}
	}
	r.ends[n] = append(r.ends[n], e)
}

// Event records whether ctx came from a Start.
func (r *Calls) Event(ctx context.Context, _ observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := CallOf(ctx)
	r.events = append(r.events, ok)
}

// Ended returns each call's name, Key and outcome event, in the order of
// their Starts, after checking that each Start had exactly one End, with
// its context.
func (r *Calls) Ended(t testing.TB) []Ended {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.bad {
		t.Error(b)
	}
	out := make([]Ended, len(r.starts))
	for i, c := range r.starts {
		ends := r.ends[i+1]
		if len(ends) != 1 {
			t.Errorf("call %d (%s %q): %d Ends, want 1", i+1, c.Name, c.Key, len(ends))
			continue
		}
		out[i] = Ended{Call: c, Event: ends[0]}
	}
	return out
}

// Ended is a call and its outcome.
type Ended struct {
	observe.Call
	Event observe.Event
}

// Events counts the Events whose ctx came from a Start (in) and the
// others (out).
func (r *Calls) Events() (in, out int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ok := range r.events {
		if ok {
			in++
		} else {
			out++
		}
	}
	return in, out
}

// WantCall is a call that should have ended: its name and Key, its
// outcome's name, and whether the outcome carries an error.
type WantCall struct {
	Name, Key, Event string
	Err              bool
}

// Want checks the calls that ended (see Ended) against want, in order;
// each outcome's Key must be its call's.
func (r *Calls) Want(t testing.TB, want []WantCall) {
	t.Helper()
	got := r.Ended(t)
	if len(got) != len(want) {
		t.Fatalf("%d calls, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || g.Key != w.Key || g.Event.Name != w.Event || g.Event.Key != w.Key || w.Err != (g.Event.Err != nil) {
			t.Errorf("call %d: %s %q ended with %+v; want %s %q ending with %s (an error: %v)", i+1, g.Name, g.Key, g.Event, w.Name, w.Key, w.Event, w.Err)
		}
	}
}

// Ends is the WantCall of a call name on key that ended with event
// (carrying an error if err).
func Ends(name, key, event string, err bool) WantCall {
	return WantCall{Name: name, Key: key, Event: event, Err: err}
}
