// Package observe is how nolock's packages report what they do: one Event
// type and one Observer function type, shared by every package, so that
// one adapter turns all of them into metrics, traces or logs (see the
// OpenTelemetry adapter, and docs/observability.md for the events each
// package reports).
//
// A package takes an Observer as an option (WithObserver). A nil Observer
// costs nothing. An Observer is never called with a lock of the library
// held; a panic in it is recovered, so it never breaks a pattern, and
// counted in the Dropped field of the next event that observer gets (see
// Guard). Packages with background work (a lock's heartbeats)
// hand their events to the observer through a queue of their own, so an
// observer that is slow or blocks never stalls a renewal; when that queue
// is full, events are dropped, and the next event delivered says how many
// (Event.Dropped).
package observe

import (
	"context"
	"sync/atomic"
	"time"
)

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

// Observer receives events. It may be called from several goroutines at
// once, and should return quickly.
type Observer func(ctx context.Context, e Event)

// Guard returns an Observer that calls o and recovers a panic of o,
// counting the event in the Dropped field of the next event it passes to
// o (with the count the panicking event carried): a panic never breaks a
// pattern, and is never lost. Guard returns nil for a
// nil o. The count belongs to the Observer Guard returns: every nolock
// value (a Store, a Client) guards the observer its options give it, so
// each counts its own and nothing is counted process-wide.
func Guard(o Observer) Observer {
	if o == nil {
		return nil
	}
	var panics atomic.Int64
	return func(ctx context.Context, e Event) {
		n := panics.Swap(0)
		e.Dropped += n
		defer func() {
			if r := recover(); r != nil {
				panics.Add(n + 1) // this event, and those it carried
			}
		}()
		o(ctx, e)
	}
}

// Notify calls o with e unless o is nil, recovering a panic of o (which a
// Guard of o counts). It is for nolock's packages; an Observer of your own
// is called directly.
func (o Observer) Notify(ctx context.Context, e Event) {
	if o == nil {
		return
	}
	defer func() { _ = recover() }()
	o(ctx, e)
}
