package cas

import (
	"context"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// call is an Update or Retry begun with the observer's Start.
type call struct {
	sp    observed.Span
	key   string
	start time.Time // zero without an observer
}

// begin starts the call named name on key (see CallUpdate, CallRetry) and
// returns the context it goes on with.
func (c *config) begin(ctx context.Context, name, key string) (context.Context, call) {
	ctx, sp := observed.Start(c.obs, ctx, observe.Call{Name: name, Key: key})
	cl := call{sp: sp, key: key}
	if sp.On() {
		cl.start = time.Now()
	}
	return ctx, cl
}

// endUpdate ends an Update: EventUpdated, or EventFailed with err.
func (cl *call) endUpdate(err error) {
	if !cl.sp.On() {
		return
	}
	e := observe.Event{Name: EventUpdated, Key: cl.key, Duration: time.Since(cl.start), Err: err}
	if err != nil {
		e.Name = EventFailed
	}
	cl.sp.End(e)
}

// endRetry ends a Retry that made attempts (at most): EventCommitted,
// EventGaveUp when they ran out, else EventFailed with err.
func (cl *call) endRetry(attempts int, err error) {
	if !cl.sp.On() {
		return
	}
	e := observe.Event{Name: EventCommitted, N: 1}
	if last, ok := backoff.Last(err); ok {
		e = observe.Event{Name: EventGaveUp, Attempt: attempts, Err: last}
	} else if err != nil {
		e = observe.Event{Name: EventFailed, Duration: time.Since(cl.start), Err: err}
	}
	cl.sp.End(e)
}
