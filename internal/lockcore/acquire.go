package lockcore

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Acquisition is the state of one Acquire or TryAcquire that both
// backends share. The package sets Name, Key, Try, Wait and Cleanup, then
// calls Keeper.Acquire with its step; the step reads and updates the rest.
type Acquisition struct {
	Name string // the lock in messages: %q of its key (and sort key)
	Key  string // the lock in events
	Try  bool   // TryAcquire: give up instead of waiting
	Wait time.Duration
	// Cleanup returns, from the acquisition's state when it gives up, the
	// release of what its calls with an unknown outcome may have taken;
	// it runs in the background, bounded by a lease.
	Cleanup func() func(ctx context.Context)
	// Span is the call's, from Keeper.Begin; Acquire ends it.
	Span observed.Span

	Deadline  time.Time // the wait's end; zero: until ctx ends
	Tries     int       // acquiring calls sent
	LastErr   error     // the last call's error; nil after one that answered
	Errs      int       // calls in a row that failed
	Ambiguous bool      // a call of ours has an unknown outcome

	k   *Keeper
	ctx context.Context // the one the call's Start returned
}

// Step is one try of an acquisition: it returns the lock, an error to end
// with (from GiveUp), or how long to wait before the next try.
type Step func(ctx context.Context) (*Hold, time.Duration, error)

// Acquire runs an acquisition: it registers with the Keeper (so Close
// waits for it and ends it with Config.Closed), runs step until it
// returns a lock or an error, sleeping as it asks (never past the wait's
// end), and ends a.Span with the outcome. ctx is the one Keeper.Begin
// returned.
func (k *Keeper) Acquire(ctx context.Context, a *Acquisition, step Step) (*Hold, error) {
	start := k.cfg.Now()
	if err := k.Enter(); err != nil {
		k.NotAcquired(a.Span, a.Key, err)
		return nil, err
	}
	defer k.Leave()
	a.k, a.ctx = k, ctx
	if a.Wait > 0 {
		a.Deadline = start.Add(a.Wait)
	}
	h, err := a.run(ctx, step)
	e := observe.Event{Name: k.cfg.Events.Acquired, Key: a.Key, Attempt: a.Tries, Duration: k.cfg.Now().Sub(start), Err: err}
	if h != nil {
		e.Token = h.Token
	} else {
		e.Name = k.cfg.Events.NotAcquired
	}
	a.Span.End(e)
	return h, err
}

// Event reports e, an event of the acquisition, on the calling goroutine
// with the context the call's Start returned.
func (a *Acquisition) Event(e observe.Event) { observed.Event(a.k.cfg.Observer, a.ctx, e) }

func (a *Acquisition) run(ctx context.Context, step Step) (*Hold, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.k.ctx, cancel)()
	for {
		if err := ctx.Err(); err != nil {
			return nil, a.GiveUp(err)
		}
		h, wait, err := step(ctx)
		if h != nil || err != nil {
			return h, err
		}
		if err := backoff.Sleep(ctx, a.Bound(wait)); err != nil {
			return nil, a.GiveUp(err)
		}
	}
}

// Bound returns d, cut short at the wait's end.
func (a *Acquisition) Bound(d time.Duration) time.Duration {
	if !a.Deadline.IsZero() {
		d = min(d, a.Deadline.Sub(a.k.cfg.Now()))
	}
	return d
}

// Passed reports whether the wait's end has passed.
func (a *Acquisition) Passed() bool {
	return !a.Deadline.IsZero() && !a.k.cfg.Now().Before(a.Deadline)
}

// Answered records a call that answered.
func (a *Acquisition) Answered() { a.LastErr, a.Errs = nil, 0 }

// Failing records a call's error and returns the error to give up with,
// if any: for TryAcquire after three calls in a row, for a bounded
// Acquire once its wait has passed.
func (a *Acquisition) Failing(err error) error {
	a.LastErr = err
	a.Errs++
	switch {
	case a.Try && a.Errs >= 3:
		return errfmt.Errorf("%d %s in a row failed: %w", a.Errs, a.k.cfg.Calls, err)
	case a.Passed():
		return errfmt.Errorf("wait of %v passed while %s failed: %w", a.Wait, a.k.cfg.Calls, err)
	}
	return nil
}

// GiveUp ends the acquisition with err: it releases in the background
// what a call of ours with an unknown outcome may have taken, and returns
// Config.Closed if the Client was closed, a not-acquired error (the
// package's *HeldError) as it is, or err with the last store error.
func (a *Acquisition) GiveUp(err error) error {
	k := a.k
	if a.Ambiguous && a.Cleanup != nil {
		a.Ambiguous = false
		release := a.Cleanup()
		k.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Lease)
			defer cancel()
			release(ctx)
		})
	}
	switch {
	case k.ctx.Err() != nil:
		return k.cfg.Closed
	case errors.Is(err, k.cfg.NotAcquired):
		return err
	case a.LastErr != nil && !errors.Is(err, a.LastErr):
		return errfmt.Errorf("%s: acquire %s: %w (last %s error: %w)", k.cfg.Prefix, a.Name, err, k.cfg.Store, a.LastErr)
	}
	return errfmt.Errorf("%s: acquire %s: %w", k.cfg.Prefix, a.Name, err)
}

// Jitter returns a uniform duration in [d/2, d].
func Jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// Settings returns the Keeper's checked settings.
func (k *Keeper) Settings() Settings { return k.cfg.Settings }
