package conditional

import "github.com/nolock/nolock/observe"

// ObserverOption is WithObserver's option. Every constructor of this
// package takes it: it is a StockOption, an AccountsOption, a HoldsOption
// and a FencedOption.
type ObserverOption func(*observe.Observer)

// WithObserver reports each call's outcome to o (nil, the default: none),
// on the calling goroutine (a coalesced batch's event on the goroutine
// that sent it), never with a lock held. The events are the package's
// Event constants, whose docs say which type reports each and its
// fields: Stock and Accounts report each take or debit (EventGranted,
// EventRefused, EventFailed), coalesced statements (EventBatch, from a
// goroutine of the Stock's own, which Close drains) and the endgame's
// gathering (EventGathered); Holds each Hold, HoldAll, Confirm and Release
// (EventHeld, EventConfirmed, EventReleased, EventRefused, EventFailed);
// Fenced each Update (EventWritten, EventFenced, EventFailed).
func WithObserver(o observe.Observer) ObserverOption {
	return func(p *observe.Observer) { *p = observe.Guard(o) }
}

func (o ObserverOption) applyStock(c *stockConfig)    { o(&c.obs) }
func (o ObserverOption) applyAccounts(c *stockConfig) { o(&c.obs) }
func (o ObserverOption) applyHolds(c *holdsConfig)    { o(&c.obs) }
func (o ObserverOption) applyFenced(c *fencedConfig)  { o(&c.obs) }
