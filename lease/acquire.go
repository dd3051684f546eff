package lease

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/lockcore"
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

// acquisition is the state of one Acquire or TryAcquire call beyond the
// core's. Its methods run on the calling goroutine only.
type acquisition struct {
	*lockcore.Acquisition
	c      *Client
	ac     acquireConfig
	caller context.Context // the caller's: its values go to the Lock's Context
	bo     backoff.Policy
	ours   []sent // statements that may have applied
	races  int    // tries that found no row to report (created meanwhile)
}

// acquire runs Acquire (try false) or TryAcquire (try true): it validates
// the options before any I/O and runs the tries in the core's wait loop.
func (c *Client) acquire(ctx context.Context, key string, opts []AcquireOption, try bool) (*Lock, error) {
	if ctx == nil {
		return nil, invalid("ctx is nil")
	}
	caller := ctx
	ac, err := c.acquireConfig(key, opts)
	ctx, sp := c.k.Begin(ctx, key, try)
	if err != nil {
		c.k.NotAcquired(sp, key, err)
		return nil, err
	}
	a := &acquisition{c: c, ac: ac, caller: caller,
		bo: backoff.Policy{Base: max(c.cfg.Poll/16, time.Millisecond), Cap: c.cfg.Poll}}
	a.Acquisition = &lockcore.Acquisition{Name: strconv.Quote(key), Key: key, Try: try, Wait: ac.wait, Cleanup: a.cleanup, Span: sp}
	h, err := c.k.Acquire(ctx, a.Acquisition, a.attempt)
	if err != nil {
		return nil, err
	}
	return h.Ref.(*Lock), nil
}

// attempt sends the acquiring statement once. It returns the lock if the
// statement (or an earlier one of this call, whose answer was lost) took
// it; an error to end the call with; or how long to wait before the next
// try.
func (a *acquisition) attempt(ctx context.Context) (*lockcore.Hold, time.Duration, error) {
	c := a.c
	a.Tries++
	s := sent{nonce: rand.Text(), at: c.cfg.Now()}
	a.ours = append(a.ours, s)
	if len(a.ours) > maxPending {
		a.ours = a.ours[1:] // an older statement that applies late expires like anyone's
	}
	bound := c.cfg.Lease
	if !a.Deadline.IsZero() {
		bound = min(bound, max(a.Deadline.Sub(s.at), c.cfg.Poll))
	}
	callCtx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	args := c.over.Args(a.ac.key, c.cfg.Owner, s.nonce, micros(c.cfg.Lease), a.ac.data, micros(c.cfg.lockDelay))
	var won bool
	var token, left int64
	var owner, nonce string
	var data []byte
	if a.Tries == 1 {
		// The first try takes a free lock with the bare statement; only a
		// refusal needs the holder's row, which the next try, sent at
		// once, returns.
		err := c.pg.Row(callCtx, c.db, c.sql.take, args...).Scan(&token)
		switch {
		case err == nil:
			return a.won(s, token)
		case errors.Is(err, pgx.ErrNoRows):
			a.ours = a.ours[:len(a.ours)-1]
			return nil, 0, nil
		}
		return a.failed(ctx, s, err)
	}
	err := c.pg.Row(callCtx, c.db, c.sql.acquire, args...).Scan(&won, &token, &owner, &nonce, &data, &left)
	switch {
	case err == nil && won:
		return a.won(s, token)
	case err == nil:
		a.Answered()
		return a.held(s, token, owner, nonce, data, time.Duration(left)*time.Microsecond)
	case errors.Is(err, pgx.ErrNoRows): // refused by a row created after the snapshot
		a.Answered()
		a.races++
		if a.Try && a.races >= 3 {
			return nil, 0, a.GiveUp(&HeldError{Key: a.ac.key})
		}
		return nil, a.bo.Delay(a.races), nil
	}
	return a.failed(ctx, s, err)
}

// won makes the Lock that statement s took with token.
func (a *acquisition) won(s sent, token int64) (*lockcore.Hold, time.Duration, error) {
	l, err := a.c.newLock(a.caller, a.ac, s, token)
	if err != nil {
		return nil, 0, err
	}
	return l.h, 0, nil
}

// held handles a try that found the lock held. If the row carries one of
// this call's earlier statements, sent less than a lease ago, that
// statement took the lock: it is the Lock. Otherwise TryAcquire gives up,
// and Acquire waits a poll period, or until the holder's lease (plus the
// lock-delay) ends by the database's clock if sooner.
func (a *acquisition) held(s sent, token int64, owner, nonce string, data []byte, left time.Duration) (*lockcore.Hold, time.Duration, error) {
	c := a.c
	for _, p := range a.ours {
		if p.nonce == nonce && nonce != s.nonce && c.cfg.Now().Sub(p.at) < c.cfg.Lease {
			return a.won(p, token)
		}
	}
	h := &HeldError{Key: a.ac.key, Owner: owner, Token: token, Data: data}
	a.Event(observe.Event{Name: EventContended, Key: a.ac.key, Token: token, Attempt: a.Tries})
	if a.Try || a.Passed() {
		return nil, 0, a.GiveUp(h)
	}
	wait := lockcore.Jitter(c.cfg.Poll)
	if left > 0 && left < wait {
		wait = left + time.Millisecond
	}
	return nil, max(wait, time.Millisecond), nil
}

// failed handles a statement that failed: one that may have applied is
// kept (a later try finds it), one that did not is forgotten. It returns
// an error to end the call with, or the backoff before the next try.
func (a *acquisition) failed(ctx context.Context, s sent, err error) (*lockcore.Hold, time.Duration, error) {
	if pgerr.Of(err) == pgerr.Unknown {
		a.Ambiguous = true
	} else {
		a.ours = a.ours[:len(a.ours)-1]
		if pgerr.Of(err) == pgerr.Refused && !transient(err) {
			return nil, 0, a.GiveUp(err)
		}
	}
	a.c.k.Log().Debug("lease: acquiring statement failed", "key", a.ac.key, "outcome", pgerr.Of(err), "err", err)
	stop := a.Failing(err)
	if ctx.Err() != nil {
		stop = ctx.Err()
	}
	if stop != nil {
		return nil, 0, a.GiveUp(stop)
	}
	return nil, a.bo.Delay(a.Errs + 1), nil
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

// cleanup returns the release of the row of the key if it carries one of
// the statements of ours that may have applied.
func (a *acquisition) cleanup() func(context.Context) {
	nonces := make([]string, len(a.ours))
	for i, s := range a.ours {
		nonces[i] = s.nonce
	}
	c, key := a.c, a.ac.key
	return func(ctx context.Context) {
		if _, err := c.pg.Exec(ctx, c.db, c.sql.cleanup, c.over.Args(key, nonces)...); err != nil {
			c.k.Log().Debug("lease: releasing an acquisition with an unknown outcome failed", "key", key, "err", err)
		}
	}
}
