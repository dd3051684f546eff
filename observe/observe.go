// Package observe is how nolock's packages report what they do: one
// Observer interface and one Event type, shared by every package, so that
// one adapter turns all of them into metrics, traces or logs (see the
// OpenTelemetry adapter, and docs/observability.md for the calls and
// events each package reports).
//
// A package takes an Observer as an option (WithObserver). A nil Observer
// costs nothing. Its methods are never called with a lock of the library
// held (but where a user's callback runs: docs/observability.md says
// where); a panic in one is recovered, so it never breaks a pattern, and
// counted in the Dropped field of the next event that observer gets (see
// Guard).
//
// A public call (an Acquire, a Do, a Take, the handling of a message)
// calls Start when it begins and End once when it ends, both on the
// goroutine that runs the call, so an adapter can start a span in Start
// and end it in End: the call's callbacks (a Do's fn, a handler) get the
// context Start returned, so the spans the user's own code starts (pgx's,
// an HTTP client's) nest under it. Everything else is an Event: inside a
// call (a retry's wait, a conflict) with the context Start returned;
// outside one (a lock's renewal, a coalesced batch) with the context of
// the call that started the work, its values but not its cancellation.
// Packages with background work (a lock's renewals) hand those events to
// the observer through a queue of their own, so an observer that is slow
// or blocks never stalls a renewal; when that queue is full, events are
// dropped, and the next event delivered says how many (Event.Dropped).
package observe

import (
	"context"
	"sync/atomic"
	"time"
)

// Observer receives what the patterns do. A package takes one with its
// WithObserver option; nil costs nothing. Its methods may be called from
// several goroutines at once, and should return quickly: Start and End
// run on the call's own goroutine, and delay it.
type Observer interface {
	// Start is called when a public call begins (Call says which) and
	// returns the context the call goes on with: the user's callbacks (a
	// Do's fn, a handler, a Retry's fn) get it, and so do that call's
	// Events and its End. Returning ctx unchanged is always correct.
	Start(ctx context.Context, c Call) context.Context
	// End is called once for every Start, with the context Start
	// returned, and the call's outcome event (the same event a Func
	// sees; Err set when the call failed).
	End(ctx context.Context, e Event)
	// Event reports anything else: a retry's wait, a conflict, a
	// background renewal or loss. Inside a call, ctx is the one Start
	// returned.
	Event(ctx context.Context, e Event)
}

// Func is an Observer that only wants events: Start returns ctx, End and
// Event both call f. observe.Func(func(ctx context.Context, e
// observe.Event) { … }) sees every event a package reports, outcomes
// included. A nil Func does nothing.
type Func func(ctx context.Context, e Event)

// Start returns ctx.
func (f Func) Start(ctx context.Context, _ Call) context.Context { return ctx }

// End calls f.
func (f Func) End(ctx context.Context, e Event) {
	if f != nil {
		f(ctx, e)
	}
}

// Event calls f.
func (f Func) Event(ctx context.Context, e Event) {
	if f != nil {
		f(ctx, e)
	}
}

// Call is a public call that begins. docs/observability.md lists every
// Name.
type Call struct {
	// Name is the package, a dot and the operation: "idempotency.do",
	// "lease.acquire", "inbox.handle".
	Name string
	// Key is what the call is about, as the Key of its events.
	Key string
	// Message is, for inbox and partition, the message (or the batch's
	// first) being handled; nil otherwise.
	Message *Message
}

// Message is the Kafka message a consumer call handles: what an adapter
// needs for messaging attributes and to extract the producer's trace
// context (W3C traceparent) from its headers. It shares the message's
// header values: an Observer must not modify them.
type Message struct {
	Topic     string
	Partition int
	Offset    int64
	Headers   []Header
}

// Header is a Kafka message header.
type Header struct {
	Key   string
	Value []byte
}

// Event is one thing a pattern did. Fields an event does not use are
// zero; docs/observability.md lists which fields each event sets.
type Event struct {
	// Name is the event: the package's name, a dot, and what happened,
	// e.g. "lease.acquired", "dynamolock.lost". The same happening has
	// the same suffix in every package.
	Name string
	// Key is what the event is about: a lock's key, a stock key, an
	// idempotency key, a topic/partition.
	Key string
	// Token is the fencing token, or a partition's epoch, when the event
	// has one.
	Token int64
	// Attempt counts the tries an operation took, from 1.
	Attempt int
	// N is a count: a batch's size, rows reaped, units taken.
	N int64
	// Duration is how long something took or waited: an acquisition's
	// wait, a renewal's round trip, a lock's hold, a retry's delay.
	Duration time.Duration
	// Err says why, for failures and losses.
	Err error
	// Dropped counts the events before this one that the observer did not
	// get whole: dropped because it fell behind (see the package doc), or
	// delivered to a call of it that panicked (see Guard).
	Dropped int64
}

// Guard returns an Observer that calls o and recovers a panic of any of
// its methods: a panicking Start returns its ctx argument unchanged, and
// each panic is counted in the Dropped field of the next event (of End or
// Event) it passes to o, with the count the panicking event carried. A
// panic never breaks a pattern, and is never lost. Guard returns nil for
// a nil o (or a nil Func). The count belongs to the Observer Guard
// returns: every nolock value (a Store, a Client) guards the observer its
// options give it, so each counts its own and nothing is counted
// process-wide.
func Guard(o Observer) Observer {
	if o == nil {
		return nil
	}
	if f, ok := o.(Func); ok && f == nil {
		return nil
	}
	return &guarded{o: o}
}

type guarded struct {
	o      Observer
	panics atomic.Int64
}

func (g *guarded) Start(ctx context.Context, c Call) (out context.Context) {
	defer func() {
		if r := recover(); r != nil {
			g.panics.Add(1)
			out = ctx
		}
	}()
	return g.o.Start(ctx, c)
}

func (g *guarded) End(ctx context.Context, e Event)   { g.deliver(ctx, e, true) }
func (g *guarded) Event(ctx context.Context, e Event) { g.deliver(ctx, e, false) }

// deliver passes e to o's End (end) or Event with the panics counted so
// far.
func (g *guarded) deliver(ctx context.Context, e Event, end bool) {
	n := g.panics.Swap(0)
	e.Dropped += n
	defer func() {
		if r := recover(); r != nil {
			g.panics.Add(n + 1) // this event, and those it carried
		}
	}()
	if end {
		g.o.End(ctx, e)
	} else {
		g.o.Event(ctx, e)
	}
}
