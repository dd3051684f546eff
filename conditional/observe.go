package conditional

import "github.com/nolock/nolock/observe"

// ObserverOption is WithObserver's option. Every constructor of this
// package takes it: it is a StockOption, an AccountsOption, a HoldsOption
// and a FencedOption.
type ObserverOption func(*observe.Observer)

// WithObserver reports each call's outcome to o (nil, the default: none),
// on the calling goroutine (a coalesced batch's event on the goroutine
// that sent it), never with a lock held; docs/observability.md lists the
// events.
//
// Stock and Accounts report each take or debit: "conditional.granted",
// "conditional.refused" (Err: ErrSoldOut; for Accounts ErrInsufficient)
// or "conditional.failed" (any other error,
// ErrAmbiguousCommit included), each with Key and N (the units asked);
// "conditional.batch" with Key and N (the takes one coalesced statement
// decided; from a goroutine of the Stock's own, which Close drains); and
// "conditional.gathered" with Key and N (the units left)
// when the endgame gathered a key's buckets into bucket 0.
//
// Holds reports each Hold, HoldAll, Confirm and Release, with Key (the
// resource; for HoldAll the resources, sorted, joined by ","), N (the
// resources) and Duration (the call's): "conditional.held",
// "conditional.confirmed", "conditional.released", "conditional.refused"
// (Err: a *HoldError wrapping ErrHeld or ErrConfirmed, or ErrNotHolder) or
// "conditional.failed" (any other error, ErrNotFound included).
//
// Fenced reports each Update, with Key (the key, as fmt.Sprint prints
// it), Token and Duration: "conditional.written", "conditional.fenced"
// (Err: ErrFenced; Token is the refused one) or "conditional.failed".
func WithObserver(o observe.Observer) ObserverOption {
	return func(p *observe.Observer) { *p = observe.Guard(o) }
}

func (o ObserverOption) applyStock(c *stockConfig)    { o(&c.obs) }
func (o ObserverOption) applyAccounts(c *stockConfig) { o(&c.obs) }
func (o ObserverOption) applyHolds(c *holdsConfig)    { o(&c.obs) }
func (o ObserverOption) applyFenced(c *fencedConfig)  { o(&c.obs) }
