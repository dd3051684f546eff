// Package observed calls an observe.Observer for nolock's packages: nil
// safe (a nil Observer costs a comparison, no allocation) and recovering
// a panic of an Observer the package did not guard.
package observed

import (
	"context"
	"errors"

	"github.com/nolock/nolock/observe"
)

// Span is a call begun by Start; End ends it. The zero Span (from a nil
// Observer) does nothing.
type Span struct {
	o   observe.Observer
	ctx context.Context
}

// Start calls o.Start for call c and returns the context the call goes on
// with, and the Span whose End must be called once when it ends. With a
// nil o, or a nil ctx (a call refused before anything), it returns ctx and
// the zero Span.
func Start(o observe.Observer, ctx context.Context, c observe.Call) (context.Context, Span) {
	if o == nil || ctx == nil {
		return ctx, Span{}
	}
	out := start(o, ctx, c)
	return out, Span{o: o, ctx: out}
}

func start(o observe.Observer, ctx context.Context, c observe.Call) (out context.Context) {
	out = ctx
	defer func() { _ = recover() }()
	if got := o.Start(ctx, c); got != nil {
		out = got
	}
	return out
}

// On reports whether s was started by an Observer (and has not ended): what a call spends
// only to fill an event can be skipped when it is false.
func (s Span) On() bool { return s.o != nil }

// End calls End of the Span's Observer with the context Start returned
// and e, the call's outcome, unless s has ended.
func (s *Span) End(e observe.Event) {
	o := s.o
	if o == nil {
		return
	}
	s.o = nil
	defer func() { _ = recover() }()
	o.End(s.ctx, e)
}

// ErrPanicked is the Err of the outcome Unwound reports.
var ErrPanicked = errors.New("nolock: a callback of the call panicked; the panic goes on to the call's caller")

// Unwound, deferred by a call whose callback's panic goes on to its
// caller, ends s if the call did not: with e, Err set to ErrPanicked.
func (s *Span) Unwound(e observe.Event) {
	if s.o != nil {
		e.Err = ErrPanicked
		s.End(e)
	}
}

// Event calls o.Event unless o is nil.
func Event(o observe.Observer, ctx context.Context, e observe.Event) {
	if o == nil {
		return
	}
	defer func() { _ = recover() }()
	o.Event(ctx, e)
}
