package conditional

import "github.com/nolock/nolock/observe"

// WithObserver reports each call to o (nil, the default: none): Start
// when it begins, End with its outcome (CallTake, CallDebit, CallHold,
// … say which), on the calling goroutine (a coalesced batch's event on the goroutine
// that sent it), never with a lock held. The events are the package's
// Event constants, whose docs say which type reports each and its
// fields: Stock and Accounts report each take or debit (EventGranted,
// EventRefused, EventFailed), coalesced statements (EventBatch, from a
// goroutine of the Stock's own, which Close drains) and the endgame's
// gathering (EventGathered); Holds each Hold, HoldAll, HoldAny, Confirm
// and Release (EventHeld, EventConfirmed, EventReleased, EventRefused,
// EventFailed; Get and Free report nothing);
// Fenced each Update (EventWritten, EventFenced, EventFailed).
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.used.Add(setObserver); c.obs = observe.Guard(o) }
}
