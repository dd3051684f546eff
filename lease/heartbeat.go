package lease

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/pgerr"
)

// The local deadline. A Lock is valid, on this Client's clock, until a
// lease after the moment its last confirmed statement was sent (or, after
// an answer was lost, until the time left that a read of the row reports,
// counted from when the read was sent). The database starts its lease when
// it runs the statement, after it was sent, so the holder always believes
// it holds the lock for less time than the database grants it: when the
// holder's deadline passes (Lost), the row may still be live, never the
// other way round, as long as the two clocks run at the same rate.

// renewal is the result of one renewal: the local validity it confirmed,
// and when it was sent.
type renewal struct {
	at, valid time.Time // at: when the renewal was sent (or the row read)
	err       error
}

// run is the renewal goroutine: it renews the lease every heartbeat
// period, watches the local validity and the maximum hold, and ends the
// lock when one of them runs out or a renewal finds the lock gone. A
// renewal runs in its own goroutine, so a slow one delays neither the
// warning nor the end of the lock. Deadlines are instants of the Client's
// clock and timers run on the monotonic clock, so a process that resumes
// after a pause finds them passed at once. When run returns, its renewal
// goroutine has ended.
func (l *Lock) run(ctx context.Context) {
	c := l.c
	defer c.wg.Done()
	defer close(l.done)
	hb := c.cfg.heartbeat
	retry := backoff.Policy{Base: max(hb/8, time.Millisecond), Cap: max(hb/2, time.Millisecond)}
	next := l.start.Add(hb)
	var maxAt time.Time
	if l.ac.maxHold > 0 {
		maxAt = l.start.Add(l.ac.maxHold)
	}
	results := make(chan renewal, 1)
	inFlight := false
	var callAt time.Time
	var last error // the last renewal's error; nil after one that was confirmed
	failures := 0
	defer func() {
		if inFlight {
			l.stop() // the renewal's answer no longer matters
			<-results
		}
	}()
	for {
		now := c.cfg.now()
		l.mu.Lock()
		valid, warned := l.validUntil, l.warned
		l.mu.Unlock()
		if !maxAt.IsZero() && !now.Before(maxAt) {
			l.lose(&LostError{Key: l.ac.key, Cause: MaxHold})
			rctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
			l.releaseRow(rctx)
			cancel()
			return
		}
		warnAt := valid.Add(-c.cfg.warn)
		if !maxAt.IsZero() && maxAt.Add(-c.cfg.warn).Before(warnAt) {
			warnAt = maxAt.Add(-c.cfg.warn)
		}
		if !warned && !now.Before(warnAt) {
			l.mu.Lock()
			first := l.warnLocked()
			l.mu.Unlock()
			if first {
				l.event(EventExpiring, 0, nil)
			}
			warned = true
		}
		if !now.Before(valid) {
			l.lose(&LostError{Key: l.ac.key, Cause: Expired, Last: hung(last, inFlight, now.Sub(callAt))})
			return
		}
		if !inFlight && !now.Before(next) {
			inFlight, callAt = true, now
			go func() { results <- l.renew(ctx, valid) }()
		}
		wakes := []time.Time{valid}
		if !inFlight {
			wakes = append(wakes, next)
		}
		if !maxAt.IsZero() {
			wakes = append(wakes, maxAt)
		}
		if !warned {
			wakes = append(wakes, warnAt)
		}
		t := time.NewTimer(slices.MinFunc(wakes, time.Time.Compare).Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case r := <-results:
			t.Stop()
			inFlight = false
			if !l.settled(r, &failures, &last, &next, retry) {
				return
			}
		}
	}
}

// settled handles a renewal's answer: a *LostError ends the lock (it
// returns false); a failure schedules a retry after a growing backoff; a
// confirmed renewal extends the local validity and schedules the next a
// heartbeat after it was sent.
func (l *Lock) settled(r renewal, failures *int, last *error, next *time.Time, retry backoff.Policy) bool {
	var le *LostError
	switch {
	case errors.As(r.err, &le):
		l.lose(le)
		return false
	case r.err != nil:
		*failures++
		*last = r.err
		*next = l.c.cfg.now().Add(retry.Delay(*failures + 2))
		l.c.log.Debug("lease: renewal failed; retrying", "key", l.ac.key, "err", r.err)
		l.event(EventRenewFailed, l.c.cfg.now().Sub(r.at), r.err)
	default:
		*failures, *last = 0, nil
		l.extend(r.valid)
		l.event(EventRenewed, l.c.cfg.now().Sub(r.at), nil)
		*next = r.at.Add(l.c.cfg.heartbeat)
	}
	return true
}

// hung returns the error to report for an expiry: the last renewal's, and
// whether one was still on the wire (the database, or the way to it,
// hangs), so that the loss does not read like a paused process.
func hung(last error, inFlight bool, since time.Duration) error {
	if !inFlight {
		return last
	}
	err := errfmt.Errorf("lease: a renewal sent %v before the lease ran out had no answer: %w",
		since.Round(time.Millisecond), context.DeadlineExceeded)
	if last != nil {
		err = errfmt.Errorf("%w (the renewal before it failed: %w)", err, last)
	}
	return err
}

// extend moves the local validity to v, if that is later.
func (l *Lock) extend(v time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if v.After(l.validUntil) {
		l.validUntil = v
	}
}

// renew extends the lease by one statement, waiting for the answer at most
// until valid or callTimeout. It returns the new local validity when the
// renewal is confirmed; a *LostError when the row is no longer ours and
// live (taken over, released, or expired on the database's clock); any
// other error when the renewal did not apply or its outcome stayed
// unknown. A renewal whose answer was lost, or that renewed nothing, is
// resolved by reading the row: if it is still ours and live, the time the
// read reports left is the validity (whether the renewal applied or not).
func (l *Lock) renew(ctx context.Context, valid time.Time) renewal {
	c := l.c
	at := c.cfg.now()
	ctx, cancel := context.WithTimeout(ctx, min(valid.Sub(at), c.cfg.callTimeout()))
	defer cancel()
	tag, err := c.pg.Exec(ctx, c.db, c.sql.renew, c.over.Args(l.ac.key, l.token, micros(c.cfg.lease))...)
	switch {
	case err == nil && tag.RowsAffected() == 1:
		return renewal{at: at, valid: at.Add(c.cfg.lease)}
	case err != nil && pgerr.Of(err) != pgerr.Unknown:
		return renewal{at: at, err: err} // not applied
	case err != nil && ctx.Err() != nil:
		return renewal{at: at, err: err} // stopped, or out of time: the next renewal decides
	}
	readAt := c.cfg.now()
	r, rerr := c.read(ctx, l.ac.key)
	switch {
	case rerr != nil && err != nil:
		return renewal{at: at, err: errfmt.Errorf("%w; reading the row back: %w", err, rerr)}
	case rerr != nil: // renewed nothing: the lock is gone, for a reason the read would have told
		return renewal{at: at, err: &LostError{Key: l.ac.key, Cause: Expired, Last: rerr}}
	case r.exists && r.token == l.token && !r.released && r.left > 0:
		return renewal{at: readAt, valid: readAt.Add(min(r.left, c.cfg.lease))}
	case r.exists && r.token == l.token && !r.released:
		return renewal{at: at, err: &LostError{Key: l.ac.key, Cause: Expired}}
	}
	return renewal{at: at, err: &LostError{Key: l.ac.key, Cause: TakenOver, Owner: r.owner, Token: r.token}}
}

// writeRelease marks the row released if it carries this lock's token.
// A try whose answer was lost, or that timed out, is repeated until ctx
// ends; a try that releases nothing reads the row: released with our
// token means an earlier try applied. It returns nil when the row is
// released with our token, a *LostError when it carries another token.
func (l *Lock) writeRelease(ctx context.Context) error {
	c := l.c
	bo := backoff.Policy{Base: time.Millisecond, Cap: max(c.cfg.releaseTimeout()/2, time.Millisecond)}
	for try := 1; ; try++ {
		callCtx, cancel := context.WithTimeout(ctx, c.cfg.releaseTimeout())
		tag, err := c.pg.Exec(callCtx, c.db, c.sql.release, c.over.Args(l.ac.key, l.token)...)
		cancel()
		if err == nil && tag.RowsAffected() == 1 {
			return nil
		}
		if err == nil {
			r, rerr := c.read(ctx, l.ac.key)
			switch {
			case rerr == nil && r.exists && r.token == l.token && r.released:
				return nil // released, by an earlier try of ours
			case rerr == nil && r.exists && r.token == l.token:
				// Ours and not released: the try met another server (a
				// failover in between). Release again.
				rerr = errors.New("the row is still held with our token")
			case rerr == nil:
				return &LostError{Key: l.ac.key, Cause: TakenOver, Owner: r.owner, Token: r.token}
			}
			err = rerr
		} else if pgerr.Of(err) == pgerr.Refused && !transient(err) {
			return errfmt.Errorf("lease: release %q: %w", l.ac.key, err)
		}
		c.log.Debug("lease: release failed; retrying", "key", l.ac.key, "outcome", pgerr.Of(err), "err", err)
		if serr := backoff.Sleep(ctx, bo.Delay(try)); serr != nil {
			return errfmt.Errorf("lease: release %q: %w (last error: %w)", l.ac.key, serr, err)
		}
	}
}
