package idemrecord

import (
	"context"
	"errors"
	"time"

	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Call is a Do or Exec call begun with the observer's Start.
type Call struct {
	observed.Span
	key   string
	start time.Time // zero without an observer
}

// Start calls obs's Start for the call named name ("idempotency.do",
// "idempotency.exec") on key and returns the context the call goes on
// with.
func Start(obs observe.Observer, ctx context.Context, name, key string) (context.Context, Call) {
	ctx, sp := observed.Start(obs, ctx, observe.Call{Name: name, Key: key})
	c := Call{Span: sp, key: key}
	if sp.On() {
		c.start = time.Now()
	}
	return ctx, c
}

// Observe ends the call with its outcome, as both stores' WithObserver
// says: "idempotency.ran" (the effect ran and committed with its record),
// "idempotency.replayed", "idempotency.mismatch",
// "idempotency.in_progress" or "idempotency.failed" (any other error),
// each with Key, Err and Duration (since the call began). The names are
// the values of idempotency's and dynamoidempotency's Event constants,
// which those packages' tests check against what they report.
func (c *Call) Observe(replayed bool, err error) {
	if !c.On() {
		return
	}
	e := observe.Event{Name: "idempotency.ran", Key: c.key, Duration: time.Since(c.start), Err: err}
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
	c.End(e)
}

// Unwound, deferred, ends a call that fn's panic unwinds with
// "idempotency.failed".
func (c *Call) Unwound() {
	if c.On() {
		c.Span.Unwound(observe.Event{Name: "idempotency.failed", Key: c.key, Duration: time.Since(c.start)})
	}
}
