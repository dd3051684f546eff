package dynamolock

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/observe"
)

// Acquire takes the lock named key, waiting while someone else holds it.
// It returns when the lock is taken; when the wait limit passes (a
// *HeldError wrapping ErrNotAcquired, or the last DynamoDB error if calls
// were failing; see WithWait); when ctx ends (an error wrapping ctx.Err()
// and, if the last call failed, its DynamoDB error); or when the Client is
// closed (ErrClosed). Keys and sort keys must be valid UTF-8 (DynamoDB
// would merge keys that differ only in invalid bytes): others are refused
// with ErrInvalid before any I/O.
//
// A free or released lock costs one conditional write. A held one is read
// every poll period; if its record version number stays unchanged for a
// full lease of the holder (as stored on the item) on this Client's own
// clock, the holder is presumed dead and the lock is taken over, with a
// write conditional on that version. So a live holder is never displaced,
// and a dead one's lock is taken over one lease to one lease plus one poll
// after its last heartbeat. Waiters are not served in order.
//
// The returned Lock heartbeats in the background until Release, Close, the
// maximum hold, or its loss; its Context carries ctx's values, not its
// cancellation. A write whose answer was lost is resolved by reading the
// item back; if Acquire gives up with such a write outstanding, a
// background goroutine (which Close waits for) releases the item in case
// the write applied. A write that was not sent or was refused needs no
// such release.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, false)
}

// TryAcquire takes the lock named key if it is free, released, or held by
// a holder this Client has seen dead: its record version number unchanged
// for a full lease since this Client first saw it (the first sightings are
// kept in a bounded cache, so calling TryAcquire periodically eventually
// takes over a dead holder's lock without comparing any clocks). Otherwise
// it returns a *HeldError wrapping ErrNotAcquired at once. It costs one
// conditional write, plus one read when the lock is held and the server
// does not return the item with a failed condition. When DynamoDB fails
// three calls in a row (a write and two reads, with a short backoff
// between them), it gives up with an error wrapping the last failure; a
// write of those that may have applied is released in the background (if
// DynamoDB stays down, the item stays held by nobody until a waiter takes
// it over, a lease later). A call that hangs instead of failing is cut off
// only after a lease, so TryAcquire can then take up to three leases.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, true)
}

// acquisition is the state of one Acquire or TryAcquire call beyond the
// core's. Its methods run on the calling goroutine only.
type acquisition struct {
	*lockcore.Acquisition
	c        *Client
	ac       acquireConfig
	caller   context.Context // the caller's: its values go to the Lock's Context
	id       string          // the lock in the sightings cache
	bo       backoff.Policy
	reading  bool    // the next step reads the item (else it writes)
	ours     []sent  // our writes that may have applied
	takeover *string // the RVN the next write may replace
	failed   int     // writes in a row that did not take the lock
}

// acquire runs Acquire (try false) or TryAcquire (try true): it validates
// the options before any I/O and runs the steps in the core's wait loop.
func (c *Client) acquire(ctx context.Context, key string, opts []AcquireOption, try bool) (*Lock, error) {
	if ctx == nil {
		return nil, invalid("ctx is nil")
	}
	caller := ctx
	ac, err := c.acquireConfig(key, opts)
	ctx, sp := c.k.Begin(ctx, eventKey(key, ac.sortKey), try)
	if err != nil {
		c.k.NotAcquired(sp, eventKey(key, ac.sortKey), err)
		return nil, err
	}
	a := &acquisition{c: c, ac: ac, caller: caller, id: ac.key + "\x00" + ac.sortKey,
		bo: backoff.Policy{Base: max(c.cfg.Poll/16, time.Millisecond), Cap: c.cfg.Poll}}
	a.Acquisition = &lockcore.Acquisition{Name: lockName(ac.key, ac.sortKey), Key: eventKey(ac.key, ac.sortKey),
		Try: try, Wait: ac.wait, Cleanup: a.cleanup, Span: sp}
	h, err := c.k.Acquire(ctx, a.Acquisition, a.step)
	if err != nil {
		return nil, err
	}
	return h.Ref.(*Lock), nil
}

// step reads the lock item or sends the acquiring write, and judges what
// it learns.
func (a *acquisition) step(ctx context.Context) (*lockcore.Hold, time.Duration, error) {
	if a.reading {
		return a.read(ctx)
	}
	return a.write(ctx)
}

// write sends the acquiring write. It returns the lock if the write
// applied. On a failed condition it judges the item the server returned,
// or reads it next. A write with an unknown outcome is remembered (a read
// finds it if it applied) and the item read; one that changed nothing is
// forgotten, and ends the acquisition if no retry can fix it.
func (a *acquisition) write(ctx context.Context) (*lockcore.Hold, time.Duration, error) {
	a.Tries++
	s := sent{rvn: newRVN(), at: a.c.cfg.Now()}
	a.ours = append(a.ours, s)
	if len(a.ours) > maxPending {
		a.ours = a.ours[1:] // an older write that applies late is treated as anyone's: safe
	}
	out, err := a.c.writeAcquire(ctx, a.ac, s.rvn, a.takeover)
	if err == nil {
		tok, _ := strconv.ParseInt(numAttr(out.Attributes, TokenAttr), 10, 64)
		return a.won(s, tok)
	}
	a.failed++
	a.reading = true
	if item, ccf := ddberr.ConditionFailed(err); ccf {
		a.Answered()
		if item != nil {
			return a.judge(ctx, item)
		}
		return nil, 0, nil
	}
	if ddberr.NotApplied(err) {
		a.ours = a.ours[:len(a.ours)-1]
		if ddberr.Permanent(err) {
			return nil, 0, a.GiveUp(err)
		}
	} else {
		a.Ambiguous = true
	}
	a.c.k.Log().Debug("dynamolock: acquire write failed; reading the item", "key", a.Name, "outcome", ddberr.Of(err), "err", err)
	if ctx.Err() != nil {
		return nil, 0, a.GiveUp(ctx.Err())
	}
	if stop := a.Failing(err); stop != nil {
		return nil, 0, a.GiveUp(stop)
	}
	return nil, 0, nil
}

// won makes the Lock of write s, which applied, with token.
func (a *acquisition) won(s sent, token int64) (*lockcore.Hold, time.Duration, error) {
	l, err := a.c.newLock(a.caller, a.ac, s, token)
	if err != nil {
		return nil, 0, err
	}
	return l.h, 0, nil
}

// read reads the lock item and judges it. A failed read ends the
// acquisition if ctx ended, no retry can fix it, or Failing says so;
// otherwise it is read again after a poll period (TryAcquire: a short
// backoff).
func (a *acquisition) read(ctx context.Context) (*lockcore.Hold, time.Duration, error) {
	item, err := a.c.get(ctx, a.ac)
	if err == nil {
		a.Answered()
		return a.judge(ctx, item)
	}
	if ctx.Err() != nil {
		return nil, 0, a.GiveUp(ctx.Err())
	}
	if ddberr.Permanent(err) {
		return nil, 0, a.GiveUp(err)
	}
	a.c.k.Log().Debug("dynamolock: read failed", "key", a.Name, "err", err)
	if stop := a.Failing(err); stop != nil {
		return nil, 0, a.GiveUp(stop)
	}
	if a.Try {
		return nil, a.bo.Delay(a.Errs + 2), nil
	}
	return nil, lockcore.Jitter(a.c.cfg.Poll), nil
}

// judge decides from the lock item. If a write of ours applied less than a
// lease ago (its answer was lost, or the condition failed on an SDK retry
// of it), that is the Lock. A free or released item is written next
// (TryAcquire gives up after three writes lost that race), and so is one
// whose RVN this Client has seen unchanged for the holder's lease (a
// takeover), each after a backoff that grows with the writes that did not
// take the lock. Otherwise the lock is held: TryAcquire returns a
// *HeldError, Acquire waits until the next poll, or until the holder's
// lease would expire on this Client's clock if that is sooner, and reads
// it again.
func (a *acquisition) judge(ctx context.Context, item map[string]types.AttributeValue) (*lockcore.Hold, time.Duration, error) {
	c := a.c
	seenAt := c.cfg.Now()
	rec := parseItem(item)
	a.reading = false
	if s, ok := find(a.ours, rec.rvn); ok && rec.exists && !rec.released {
		if seenAt.Sub(s.at) < c.cfg.Lease {
			return a.won(s, rec.token)
		}
		a.takeover = &rec.rvn // ours, but its lease is spent: renew it with a fresh write
		return nil, a.bo.Delay(a.failed + 1), nil
	}
	if !rec.exists || rec.released {
		c.seen.forget(a.id)
		a.takeover = nil
		if a.Try && a.failed >= 3 { // the lock keeps changing hands: stay non-blocking
			return nil, 0, a.GiveUp(&HeldError{Key: a.ac.key, SortKey: a.ac.sortKey, Owner: rec.owner, Token: rec.token})
		}
		return nil, a.bo.Delay(a.failed + 1), nil
	}
	first := c.seen.observe(a.id, rec.rvn, seenAt)
	lease := rec.lease
	if lease == 0 {
		lease = c.cfg.Lease
	}
	expires := first.Add(lease)
	if !seenAt.Before(expires) {
		a.takeover = &rec.rvn
		c.k.Log().Debug("dynamolock: taking over a lock unchanged for a lease", "key", a.Name, "owner", rec.owner, "lease", lease)
		a.Event(observe.Event{Name: EventTakeover, Key: a.Key, Attempt: a.Tries, Duration: lease})
		return nil, a.bo.Delay(a.failed + 1), nil
	}
	held := &HeldError{Key: a.ac.key, SortKey: a.ac.sortKey, Owner: rec.owner, Token: rec.token, Data: rec.data}
	a.Event(observe.Event{Name: EventContended, Key: a.Key, Token: rec.token, Attempt: a.Tries})
	if a.Try || !seenAt.Before(a.Deadline) && !a.Deadline.IsZero() {
		return nil, 0, a.GiveUp(held)
	}
	wake := seenAt.Add(lockcore.Jitter(c.cfg.Poll))
	if expires.Before(wake) {
		wake = expires
	}
	a.reading = true
	a.failed = 0
	return nil, wake.Sub(seenAt), nil
}

// cleanup returns the release of the item if it carries one of the
// writes of ours that may have applied.
func (a *acquisition) cleanup() func(context.Context) {
	rvns := make([]string, len(a.ours))
	for i, s := range a.ours {
		rvns[i] = s.rvn
	}
	c, ac := a.c, a.ac
	return func(ctx context.Context) {
		if err := c.writeRelease(ctx, ac, rvns); err != nil && !errors.As(err, new(*lockcore.Loss)) {
			c.k.Log().Debug("dynamolock: cleanup after a given-up acquisition failed", "key", lockName(ac.key, ac.sortKey), "err", err)
		}
	}
}
