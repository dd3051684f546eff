package condcore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Outcome names the event a call reports: OK when it returned nil,
// Refused when its error is one of Refusals (an answer of the row: nothing
// changed), "conditional.failed" for any other error.
type Outcome struct {
	Call        string // the call's name (observe.Call.Name)
	OK, Refused string
	Refusals    []error
}

// The outcomes of both backends' calls (docs/observability.md lists them).
// Their names are the values of conditional's and dynamoconditional's
// Event constants, which those packages' tests check against what they
// report.
var (
	// Take is Stock's take: granted, or refused for want of stock.
	Take = Outcome{"conditional.take", "conditional.granted", "conditional.refused", []error{ErrSoldOut}}
	// Debit is Accounts' debit: granted, or refused for want of balance.
	Debit = Outcome{"conditional.debit", "conditional.granted", "conditional.refused", []error{ErrInsufficient}}
	// Hold and HoldAll are Holds' holds (and HoldAny's, see anyHold):
	// held, or refused because another holder holds the resource or it
	// is confirmed.
	Hold    = Outcome{"conditional.hold", "conditional.held", "conditional.refused", []error{ErrHeld, ErrConfirmed}}
	HoldAll = Outcome{"conditional.hold_all", Hold.OK, Hold.Refused, Hold.Refusals}
	anyHold = Outcome{"conditional.hold_any", Hold.OK, Hold.Refused, Hold.Refusals}
	// Confirm and Release are Holds' settlements, refused when the caller
	// does not hold the resource.
	Confirm = Outcome{"conditional.confirm", "conditional.confirmed", "conditional.refused", []error{ErrNotHolder}}
	Release = Outcome{"conditional.release", "conditional.released", "conditional.refused", []error{ErrNotHolder}}
	// Fence is Fenced's Update: written, or refused by a newer token.
	Fence = Outcome{"conditional.update", "conditional.written", "conditional.fenced", []error{ErrFenced}}
)

// name returns the event's name for err.
func (o Outcome) name(err error) string {
	switch {
	case err == nil:
		return o.OK
	case slices.ContainsFunc(o.Refusals, func(r error) bool { return errors.Is(err, r) }):
		return o.Refused
	}
	return "conditional.failed"
}

// Observed runs call as the call o.Call and, unless obs is nil, reports
// it to obs on the calling goroutine: Start before call, which gets the
// context Start returned, and End with e named for call's error, that
// error, and, if timed, call's Duration. With a nil obs it only runs
// call.
func Observed[T any](ctx context.Context, obs observe.Observer, o Outcome, timed bool, e observe.Event, call func(ctx context.Context) (T, error)) (T, error) {
	if obs == nil {
		return call(ctx)
	}
	ctx, sp := observed.Start(obs, ctx, observe.Call{Name: o.Call, Key: e.Key})
	start := time.Now()
	v, err := call(ctx)
	e.Name, e.Err = o.name(err), err
	if timed {
		e.Duration = time.Since(start)
	}
	sp.End(e)
	return v, err
}

// ObservedErr is Observed for a call that returns only an error.
func ObservedErr(ctx context.Context, obs observe.Observer, o Outcome, timed bool, e observe.Event, call func(ctx context.Context) error) error {
	_, err := Observed(ctx, obs, o, timed, e, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) })
	return err
}

// HoldAllKey is the Key of a HoldAll's event: its resources, sorted,
// joined by ",". It is "" unless obs is set, so that a nil observer costs
// no sort.
func HoldAllKey(obs observe.Observer, resources []string) string {
	if obs == nil {
		return ""
	}
	return strings.Join(slices.Sorted(slices.Values(resources)), ",")
}
