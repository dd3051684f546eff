package idemrecord

import (
	"context"
	"errors"
	"time"

	"github.com/nolock/nolock/observe"
)

// Observe reports a Do or Exec call's outcome on key to obs, as both
// stores' WithObserver says, unless obs is nil: "idempotency.ran" (the
// effect ran and committed with its record), "idempotency.replayed",
// "idempotency.mismatch", "idempotency.in_progress" or
// "idempotency.failed" (any other error), each with Key, Err and Duration
// (since start, when the call began). The names are the values of
// idempotency's and dynamoidempotency's Event constants, which those
// packages' tests check against what they report.
func Observe(ctx context.Context, obs observe.Observer, key string, start time.Time, replayed bool, err error) {
	if obs == nil {
		return
	}
	e := observe.Event{Name: "idempotency.ran", Key: key, Duration: time.Since(start), Err: err}
	switch {
	case errors.Is(err, ErrMismatch):
		e.Name = "idempotency.mismatch"
	case errors.Is(err, ErrInProgress):
		e.Name = "idempotency.in_progress"
	case err != nil:
		e.Name = "idempotency.failed"
	case replayed:
		e.Name = "idempotency.replayed"
	}
	obs.Notify(ctx, e)
}
