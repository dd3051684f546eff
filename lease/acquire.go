package lease

import (
	"context"
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"strings"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// Acquire takes the lock named key, waiting while someone else holds it.
// It returns when the lock is taken; when the wait limit passes (a
// *HeldError wrapping ErrNotAcquired, or the last database error if
// statements were failing; see WithWait); when ctx ends (an error wrapping
// ctx.Err() and, if the last statement failed, its error); or when the
// Client is closed (ErrClosed). Keys must be 1 to MaxKeyLen bytes of
// UTF-8 without NUL: others are refused with ErrInvalid before any I/O.
//
// Each try is one statement: it takes the row if it is free, released, or
// its lease (plus the lock-delay, for a holder that did not release) has
// run out on the database's clock, adding 1 to the fencing token; or it
// returns the holder. A waiter tries again after a poll period, or as soon
// as the database says the holder's lease ends, if sooner. Waiters are not
// served in order.
//
// The returned Lock renews its lease in the background until Release,
// Close, the maximum hold, or its loss; its Context carries ctx's values,
// not its cancellation. A statement whose answer was lost is resolved by
// the next try, which returns the row: if it carries this call's
// acquisition, that is the Lock. If Acquire gives up with such a statement
// outstanding, a background goroutine (which Close waits for) releases
// the row in case it applied.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, false)
}

// TryAcquire takes the lock named key if it is free, released, or its
// lease (plus the lock-delay) has run out on the database's clock;
// otherwise it returns a *HeldError wrapping ErrNotAcquired at once. It
// costs one statement. A statement that fails is retried after a short
// backoff, three tries in all; then TryAcquire gives up with an error
// wrapping the last failure.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, true)
}

// sent is an acquiring statement: its acquisition's nonce, and when it
// was sent on this Client's clock.
type sent struct {
	nonce string
	at    time.Time
}

// acquisition is the state of one Acquire or TryAcquire call. Its methods
// run on the calling goroutine only.
type acquisition struct {
	c        *Client
	ac       acquireConfig
	caller   context.Context // the caller's: its values go to the Lock's Context
	try      bool
	bo       backoff.Policy
	start    time.Time // when the call began
	deadline time.Time // the wait's end; zero: until ctx ends
	tries    int       // statements sent

	ours      []sent // statements that may have applied
	ambiguous bool   // one of them has an unknown outcome
	lastErr   error  // the last statement's error; nil after one that answered
	errs      int    // statements in a row that failed
	races     int    // tries that found no row to report (created meanwhile)
}

// acquire runs Acquire (try false) or TryAcquire (try true): it validates
// the options before any I/O, registers with the Client (so Close waits
// for it and makes it return ErrClosed), runs the tries, and reports the
// outcome to the observer.
func (c *Client) acquire(ctx context.Context, key string, opts []AcquireOption, try bool) (*Lock, error) {
	if ctx == nil {
		return nil, invalid("ctx is nil")
	}
	ac, err := c.acquireConfig(key, opts)
	if err != nil {
		return nil, err
	}
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.wg.Done()
	a := &acquisition{c: c, ac: ac, caller: ctx, try: try, start: c.cfg.now(),
		bo: backoff.Policy{Base: max(c.cfg.poll/16, time.Millisecond), Cap: c.cfg.poll}}
	if ac.wait > 0 {
		a.deadline = a.start.Add(ac.wait)
	}
	l, err := a.run(ctx)
	e := observe.Event{Name: EventAcquired, Key: key, Attempt: a.tries, Duration: c.cfg.now().Sub(a.start), Err: err}
	if l != nil {
		e.Token = l.token
	} else {
		e.Name = EventNotAcquired
	}
	c.events.Notify(ctx, e)
	return l, err
}

// run tries until a try returns a Lock or an error, pausing as the try
// says between them.
func (a *acquisition) run(ctx context.Context) (*Lock, error) {
	c := a.c
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	for {
		if err := ctx.Err(); err != nil {
			return a.giveUp(err)
		}
		l, wait, err := a.attempt(ctx)
		if l != nil || err != nil {
			return l, err
		}
		if !a.deadline.IsZero() {
			wait = min(wait, a.deadline.Sub(c.cfg.now()))
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return a.giveUp(err)
		}
	}
}

// attempt sends the acquiring statement once. It returns the Lock if the
// statement (or an earlier one of this call, whose answer was lost) took
// it; an error to end the call with; or how long to wait before the next
// try.
func (a *acquisition) attempt(ctx context.Context) (*Lock, time.Duration, error) {
	c := a.c
	a.tries++
	s := sent{nonce: rand.Text(), at: c.cfg.now()}
	a.ours = append(a.ours, s)
	if len(a.ours) > maxPending {
		a.ours = a.ours[1:] // an older statement that applies late expires like anyone's
	}
	bound := c.cfg.lease
	if !a.deadline.IsZero() {
		bound = min(bound, max(a.deadline.Sub(s.at), c.cfg.poll))
	}
	callCtx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	args := c.over.Args(a.ac.key, c.cfg.owner, s.nonce, micros(c.cfg.lease), a.ac.data, micros(c.cfg.lockDelay))
	var won bool
	var token, left int64
	var owner, nonce string
	var data []byte
	if a.tries == 1 {
		// The first try takes a free lock with the bare statement; only a
		// refusal needs the holder's row, which the next try, sent at
		// once, returns.
		err := c.pg.Row(callCtx, c.db, c.sql.take, args...).Scan(&token)
		switch {
		case err == nil:
			l, err := c.newLock(a.caller, a.ac, s, token)
			return l, 0, err
		case errors.Is(err, pgx.ErrNoRows):
			a.ours = a.ours[:len(a.ours)-1]
			return nil, 0, nil
		}
		return a.failed(ctx, s, err)
	}
	err := c.pg.Row(callCtx, c.db, c.sql.acquire, args...).Scan(&won, &token, &owner, &nonce, &data, &left)
	switch {
	case err == nil && won:
		l, err := c.newLock(a.caller, a.ac, s, token)
		return l, 0, err
	case err == nil:
		a.lastErr, a.errs = nil, 0
		return a.held(s, token, owner, nonce, data, time.Duration(left)*time.Microsecond)
	case errors.Is(err, pgx.ErrNoRows): // refused by a row created after the snapshot
		a.lastErr, a.errs = nil, 0
		a.races++
		if a.try && a.races >= 3 {
			_, err := a.giveUp(&HeldError{Key: a.ac.key})
			return nil, 0, err
		}
		return nil, a.bo.Delay(a.races), nil
	}
	return a.failed(ctx, s, err)
}

// held handles a try that found the lock held. If the row carries one of
// this call's earlier statements, sent less than a lease ago, that
// statement took the lock: it is the Lock. Otherwise TryAcquire gives up,
// and Acquire waits a poll period, or until the holder's lease (plus the
// lock-delay) ends by the database's clock if sooner.
func (a *acquisition) held(s sent, token int64, owner, nonce string, data []byte, left time.Duration) (*Lock, time.Duration, error) {
	c := a.c
	for _, p := range a.ours {
		if p.nonce == nonce && nonce != s.nonce && c.cfg.now().Sub(p.at) < c.cfg.lease {
			l, err := c.newLock(a.caller, a.ac, p, token)
			return l, 0, err
		}
	}
	h := &HeldError{Key: a.ac.key, Owner: owner, Token: token, Data: data}
	c.events.Notify(a.caller, observe.Event{Name: EventContended, Key: a.ac.key, Token: token, Attempt: a.tries})
	if a.try || !a.deadline.IsZero() && !c.cfg.now().Before(a.deadline) {
		_, err := a.giveUp(h)
		return nil, 0, err
	}
	wait := jitter(c.cfg.poll)
	if left > 0 && left < wait {
		wait = left + time.Millisecond
	}
	return nil, max(wait, time.Millisecond), nil
}

// failed handles a statement that failed: one that may have applied is
// kept (a later try finds it), one that did not is forgotten. It returns
// an error to end the call with, or the backoff before the next try.
func (a *acquisition) failed(ctx context.Context, s sent, err error) (*Lock, time.Duration, error) {
	if pgerr.Of(err) == pgerr.Unknown {
		a.ambiguous = true
	} else {
		a.ours = a.ours[:len(a.ours)-1]
		if pgerr.Of(err) == pgerr.Refused && !transient(err) {
			_, err := a.giveUp(err)
			return nil, 0, err
		}
	}
	a.c.log.Debug("lease: acquiring statement failed", "key", a.ac.key, "outcome", pgerr.Of(err), "err", err)
	a.lastErr = err
	a.errs++
	var stop error
	switch {
	case ctx.Err() != nil:
		stop = ctx.Err()
	case a.try && a.errs >= 3:
		stop = errfmt.Errorf("%d statements in a row failed: %w", a.errs, err)
	case !a.deadline.IsZero() && !a.c.cfg.now().Before(a.deadline):
		stop = errfmt.Errorf("wait of %v passed while statements failed: %w", a.ac.wait, err)
	}
	if stop != nil {
		_, err := a.giveUp(stop)
		return nil, 0, err
	}
	return nil, a.bo.Delay(a.errs + 1), nil
}

// transient reports a refusal that a later try may not meet: a
// serialization failure or deadlock, a lock timeout, a server short of
// resources or starting up.
func transient(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return pgerr.Conflict(err) || strings.HasPrefix(pgErr.Code, "53") || pgErr.Code == "55P03" || pgErr.Code == "57P03"
}

// giveUp ends the acquisition with err: it releases in the background what
// a statement of ours with an unknown outcome may have taken, and returns
// ErrClosed if the Client was closed, a *HeldError as it is, or err with
// the last database error.
func (a *acquisition) giveUp(err error) (*Lock, error) {
	if a.ambiguous {
		a.c.cleanup(a.ac.key, a.ours)
	}
	var held *HeldError
	switch {
	case a.c.ctx.Err() != nil:
		return nil, ErrClosed
	case errors.As(err, &held):
		return nil, held
	case a.lastErr != nil && !errors.Is(err, a.lastErr):
		return nil, errfmt.Errorf("lease: acquire %q: %w (last database error: %w)", a.ac.key, err, a.lastErr)
	}
	return nil, errfmt.Errorf("lease: acquire %q: %w", a.ac.key, err)
}

// cleanup releases, in a goroutine Close waits for, the row of key if it
// carries one of ours; each try waits at most a lease. The caller holds a
// registration with the Client (c.wg), so adding one is safe.
func (c *Client) cleanup(key string, ours []sent) {
	nonces := make([]string, len(ours))
	for i, s := range ours {
		nonces[i] = s.nonce
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
		defer cancel()
		if _, err := c.pg.Exec(ctx, c.db, c.sql.cleanup, c.over.Args(key, nonces)...); err != nil {
			c.log.Debug("lease: releasing an acquisition with an unknown outcome failed", "key", key, "err", err)
		}
	}()
}

// jitter returns a uniform duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}
