// Package telemetry says which instrument each of nolock's calls and
// events feeds, and names errors for error.type: the one table the
// OpenTelemetry adapter (module nolockotel) and the Prometheus text of
// internal/promtext (`nolock demo -metrics`, the example services) both
// follow, so a dashboard built on one works on the other.
package telemetry

import (
	"strings"

	"github.com/nolock/nolock/observe"
)

// Instrument is one of the instruments a call or event feeds.
type Instrument struct {
	Name string // OpenTelemetry's name
	Unit string // UCUM, or an annotation such as {event}
	Kind Kind
	Help string
}

// Kind is an instrument's kind.
type Kind int

const (
	Histogram     Kind = iota // a distribution (seconds, or a batch's size)
	Counter                   // a monotonic sum
	UpDownCounter             // a sum that goes both ways
)

// The instruments. Each has one meaning: a call's End feeds exactly one
// of OperationDuration, LockWait and ProcessDuration (its duration from
// its Start), and every other event exactly one of LockRenewal, Retries
// and Outcomes (a release outside a call none: its hold is measured);
// LockHold, LocksHeld, BatchSize and Dropped are measured besides (see
// Measures).
var (
	OperationDuration = Instrument{"nolock.operation.duration", "s", Histogram, "Duration of nolock calls, by outcome."}
	LockWait          = Instrument{"nolock.lock.wait.duration", "s", Histogram, "Time Acquire and TryAcquire calls waited for a lock, by outcome."}
	LockHold          = Instrument{"nolock.lock.hold.duration", "s", Histogram, "Time locks were held, from acquisition to release."}
	LockRenewal       = Instrument{"nolock.lock.renewal.duration", "s", Histogram, "Round trip of lock renewals, by outcome."}
	ProcessDuration   = Instrument{"messaging.process.duration", "s", Histogram, "Duration of a consumer's batch, by topic and partition."}
	BatchSize         = Instrument{"nolock.batch.size", "{item}", Histogram, "Sizes of the batches written in one statement or transaction."}
	Retries           = Instrument{"nolock.retries", "{retry}", Counter, "Attempts that failed and are tried again after a wait."}
	Outcomes          = Instrument{"nolock.outcomes", "{event}", Counter, "Events without a duration, by name."}
	Dropped           = Instrument{"nolock.observer.dropped", "{event}", Counter, "Events dropped because an observer fell behind or panicked."}
	LocksHeld         = Instrument{"nolock.lock.held", "{lock}", UpDownCounter, "Locks held."}
)

// Seconds are the bucket bounds of the duration histograms: calls of a
// millisecond to holds of minutes.
var Seconds = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800}

// Items are the bucket bounds of BatchSize.
var Items = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// OfCall is the histogram a call's duration feeds, by the call's name and
// whether it handles a message: a lock's acquisition LockWait, a
// consumer's ProcessDuration, any other OperationDuration.
func OfCall(call string, message bool) Instrument {
	pattern, what, _ := strings.Cut(call, ".")
	switch {
	case IsLock(pattern) && (what == "acquire" || what == "try_acquire"):
		return LockWait
	case message:
		return ProcessDuration
	}
	return OperationDuration
}

// OfEvent is the instrument an event that ends no call feeds: Retries,
// LockRenewal (its Duration), or Outcomes; ok is false for a lock's
// release outside a call, which only Measures records.
func OfEvent(name string) (in Instrument, ok bool) {
	pattern, what, _ := strings.Cut(name, ".")
	switch {
	case strings.HasSuffix(name, ".retry"):
		return Retries, true
	case IsLock(pattern) && (what == "renewed" || what == "renew_failed"):
		return LockRenewal, true
	case IsLock(pattern) && what == "released":
		return Instrument{}, false
	}
	return Outcomes, true
}

// Measures is what an event carries besides its own count or duration.
type Measures struct {
	Held  int64 // LocksHeld's change: +1 acquired, -1 released, not released after holding, or lost
	Hold  bool  // its Duration is a lock's hold (LockHold)
	Batch bool  // its N is a batch's size (BatchSize)
}

// MeasuresOf returns the measures of e. A lock's not_released event
// ends a hold when it carries the hold's Duration (the release could not
// be written); without one, the lock's lost event ended it before.
func MeasuresOf(e observe.Event) Measures {
	var m Measures
	pattern, what, _ := strings.Cut(e.Name, ".")
	if IsLock(pattern) {
		switch what {
		case "acquired":
			m.Held = 1
		case "released":
			m.Held, m.Hold = -1, true
		case "not_released":
			if e.Duration > 0 {
				m.Held, m.Hold = -1, true
			}
		case "lost":
			m.Held = -1
		}
	}
	switch e.Name {
	case "cas.committed", "conditional.batch", "partition.committed", "inbox.committed":
		m.Batch = true
	}
	return m
}

// IsLock reports whether pattern (an event's or call's package) is a
// lock's.
func IsLock(pattern string) bool { return pattern == "lease" || pattern == "dynamolock" }

// PromName is in's name as OpenTelemetry's Prometheus exporter writes it:
// dots as underscores, a unit suffix for units that are not annotations
// ("_seconds" for s), and "_total" for a counter.
func PromName(in Instrument) string {
	n := strings.ReplaceAll(in.Name, ".", "_")
	if in.Unit == "s" {
		n += "_seconds"
	}
	if in.Kind == Counter {
		n += "_total"
	}
	return n
}
