package dynamolock

import (
	"context"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddberr"
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

// phase is what an acquisition does next.
type phase int

const (
	writing phase = iota // send the acquiring write
	reading              // read the lock item
	judging              // decide from the item read or returned
)

// acquisition is the state of one Acquire or TryAcquire call. Its methods
// run on the calling goroutine only.
type acquisition struct {
	c        *Client
	ac       acquireConfig
	caller   context.Context // the caller's: its values go to the Lock's Context
	try      bool
	name, id string
	bo       backoff.Policy
	deadline time.Time // the wait's end; zero: until ctx ends

	phase     phase
	item      map[string]types.AttributeValue // for judging: the lock item (nil: absent)
	ours      []sent                          // our writes that may have applied
	ambiguous bool                            // one of them has an unknown outcome
	takeover  *string                         // the RVN the next write may replace
	failed    int                             // writes in a row that did not take the lock
	lastErr   error                           // the last call's DynamoDB error; nil after a call that worked
	errs      int                             // calls in a row that failed with a DynamoDB error
	writes    int                             // acquiring writes sent
}

// acquire runs Acquire (try false) or TryAcquire (try true): it validates
// the options before any I/O, registers with the Client (so Close waits
// for it and makes it return ErrClosed), runs the acquisition, and reports
// the outcome to the observer.
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
	a := &acquisition{c: c, ac: ac, caller: ctx, try: try,
		name: lockName(ac.key, ac.sortKey), id: ac.key + "\x00" + ac.sortKey,
		bo: backoff.Policy{Base: max(c.cfg.poll/16, time.Millisecond), Cap: c.cfg.poll}}
	start := c.cfg.now()
	if ac.wait > 0 {
		a.deadline = start.Add(ac.wait)
	}
	l, err := a.run(ctx)
	e := observe.Event{Name: EventAcquired, Key: eventKey(a.ac.key, a.ac.sortKey), Attempt: a.writes, Duration: c.cfg.now().Sub(start), Err: err}
	if l != nil {
		e.Token = l.token
	} else {
		e.Name = EventNotAcquired
	}
	c.events.Notify(ctx, e)
	return l, err
}

// run steps the acquisition until one step returns a Lock or an error.
func (a *acquisition) run(ctx context.Context) (*Lock, error) {
	c := a.c
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()
	for {
		var l *Lock
		var err error
		if a.phase != judging {
			if err := ctx.Err(); err != nil {
				return a.giveUp(err)
			}
		}
		switch a.phase {
		case writing:
			l, err = a.write(ctx)
		case reading:
			l, err = a.read(ctx)
		case judging:
			l, err = a.judge(ctx)
		}
		if l != nil || err != nil {
			return l, err
		}
	}
}

// giveUp ends the acquisition with err: it releases in the background what
// a write of ours with an unknown outcome may have taken, and returns
// ErrClosed if the Client was closed, a *HeldError as it is, or err with
// the last DynamoDB error.
func (a *acquisition) giveUp(err error) (*Lock, error) {
	if a.ambiguous {
		a.c.cleanup(a.ac, a.ours)
	}
	var held *HeldError
	switch {
	case a.c.ctx.Err() != nil:
		return nil, ErrClosed
	case errors.As(err, &held):
		return nil, held
	case a.lastErr != nil && !errors.Is(err, a.lastErr):
		return nil, errfmt.Errorf("dynamolock: acquire %s: %w (last DynamoDB error: %w)", a.name, err, a.lastErr)
	}
	return nil, errfmt.Errorf("dynamolock: acquire %s: %w", a.name, err)
}

// failing records a DynamoDB error and returns the error to give up with,
// if any: for TryAcquire after three calls in a row (a write and two
// reads), for a bounded Acquire once its wait has passed.
func (a *acquisition) failing(err error) error {
	a.lastErr = err
	a.errs++
	switch {
	case a.try && a.errs >= 3:
		return errfmt.Errorf("%d DynamoDB calls in a row failed: %w", a.errs, err)
	case !a.deadline.IsZero() && !a.c.cfg.now().Before(a.deadline):
		return errfmt.Errorf("wait of %v passed while DynamoDB calls failed: %w", a.ac.wait, err)
	}
	return nil
}

// pause waits d, or until the wait's end if that comes first, or until ctx
// ends (its error).
func (a *acquisition) pause(ctx context.Context, d time.Duration) error {
	if !a.deadline.IsZero() {
		d = min(d, a.deadline.Sub(a.c.cfg.now()))
	}
	return backoff.Sleep(ctx, d)
}

// write sends the acquiring write after a backoff that grows with the
// writes that did not take the lock. It returns the Lock if the write
// applied. On a failed condition it judges the item the server returned,
// or reads it. A write with an unknown outcome is remembered (a read finds
// it if it applied) and the item read; one that changed nothing is
// forgotten, and ends the acquisition if no retry can fix it.
func (a *acquisition) write(ctx context.Context) (*Lock, error) {
	if err := a.pause(ctx, a.bo.Delay(a.failed+1)); err != nil {
		return a.giveUp(err)
	}
	a.writes++
	s := sent{rvn: newRVN(), at: a.c.cfg.now()}
	a.ours = append(a.ours, s)
	if len(a.ours) > maxPending {
		a.ours = a.ours[1:] // an older write that applies late is treated as anyone's: safe
	}
	out, err := a.c.writeAcquire(ctx, a.ac, s.rvn, a.takeover)
	if err == nil {
		tok, _ := strconv.ParseInt(numAttr(out.Attributes, TokenAttr), 10, 64)
		return a.c.newLock(a.caller, a.ac, s, tok)
	}
	a.failed++
	a.phase = reading
	if item, ccf := ddberr.ConditionFailed(err); ccf {
		a.lastErr, a.errs = nil, 0
		if item != nil {
			a.item, a.phase = item, judging
		}
		return nil, nil
	}
	if ddberr.NotApplied(err) {
		a.ours = a.ours[:len(a.ours)-1]
		if ddberr.Permanent(err) {
			return a.giveUp(err)
		}
	} else {
		a.ambiguous = true
	}
	a.c.log.Debug("dynamolock: acquire write failed; reading the item", "key", a.name, "outcome", ddberr.Of(err), "err", err)
	if ctx.Err() != nil {
		return a.giveUp(ctx.Err())
	}
	if stop := a.failing(err); stop != nil {
		return a.giveUp(stop)
	}
	return nil, nil
}

// read reads the lock item, to judge it next. A failed read ends the
// acquisition if ctx ended, no retry can fix it, or failing says so;
// otherwise it is read again after a poll period (TryAcquire: a short
// backoff).
func (a *acquisition) read(ctx context.Context) (*Lock, error) {
	item, err := a.c.get(ctx, a.ac)
	if err == nil {
		a.item, a.phase = item, judging
		a.lastErr, a.errs = nil, 0
		return nil, nil
	}
	if ctx.Err() != nil {
		return a.giveUp(ctx.Err())
	}
	if ddberr.Permanent(err) {
		return a.giveUp(err)
	}
	a.c.log.Debug("dynamolock: read failed", "key", a.name, "err", err)
	if stop := a.failing(err); stop != nil {
		return a.giveUp(stop)
	}
	wait := jitter(a.c.cfg.poll)
	if a.try {
		wait = a.bo.Delay(a.errs + 2)
	}
	if err := a.pause(ctx, wait); err != nil {
		return a.giveUp(err)
	}
	return nil, nil
}

// judge decides from the lock item. If a write of ours applied less than a
// lease ago (its answer was lost, or the condition failed on an SDK retry
// of it), that is the Lock. A free or released item is written next
// (TryAcquire gives up after three writes lost that race), and so is one
// whose RVN this Client has seen unchanged for the holder's lease (a
// takeover). Otherwise the lock is held: TryAcquire returns a *HeldError,
// Acquire waits.
func (a *acquisition) judge(ctx context.Context) (*Lock, error) {
	c := a.c
	seenAt := c.cfg.now()
	rec := parseItem(a.item)
	a.item, a.phase = nil, writing
	if s, ok := find(a.ours, rec.rvn); ok && rec.exists && !rec.released {
		if seenAt.Sub(s.at) < c.cfg.lease {
			return c.newLock(a.caller, a.ac, s, rec.token)
		}
		a.takeover = &rec.rvn // ours, but its lease is spent: renew it with a fresh write
		return nil, nil
	}
	if !rec.exists || rec.released {
		c.seen.forget(a.id)
		a.takeover = nil
		if a.try && a.failed >= 3 { // the lock keeps changing hands: stay non-blocking
			return a.giveUp(&HeldError{Key: a.ac.key, SortKey: a.ac.sortKey, Owner: rec.owner, Lease: rec.lease})
		}
		return nil, nil
	}
	first := c.seen.observe(a.id, rec.rvn, seenAt)
	lease := rec.lease
	if lease == 0 {
		lease = c.cfg.lease
	}
	expires := first.Add(lease)
	if !seenAt.Before(expires) {
		a.takeover = &rec.rvn
		c.log.Debug("dynamolock: taking over a lock unchanged for a lease", "key", a.name, "owner", rec.owner, "lease", lease)
		c.events.Notify(a.caller, observe.Event{Name: EventTakeover, Key: eventKey(a.ac.key, a.ac.sortKey), Attempt: a.writes, Duration: lease})
		return nil, nil
	}
	held := &HeldError{Key: a.ac.key, SortKey: a.ac.sortKey, Owner: rec.owner, Lease: lease, Data: rec.data}
	c.events.Notify(a.caller, observe.Event{Name: EventContended, Key: eventKey(a.ac.key, a.ac.sortKey), Token: rec.token, Attempt: a.writes})
	if a.try {
		return a.giveUp(held)
	}
	return a.waitHeld(ctx, held, seenAt, expires)
}

// waitHeld waits, for a lock seen held at seenAt, until the next poll, or
// until its lease would expire on this Client's clock if that is sooner,
// then reads it again. It gives up with held once the wait's end has
// passed, and sleeps no later than that end.
func (a *acquisition) waitHeld(ctx context.Context, held *HeldError, seenAt, expires time.Time) (*Lock, error) {
	wake := seenAt.Add(jitter(a.c.cfg.poll))
	if expires.Before(wake) {
		wake = expires
	}
	if !a.deadline.IsZero() {
		if !seenAt.Before(a.deadline) {
			return a.giveUp(held)
		}
		if a.deadline.Before(wake) {
			wake = a.deadline
		}
	}
	if err := backoff.Sleep(ctx, wake.Sub(seenAt)); err != nil {
		return a.giveUp(err)
	}
	a.phase = reading
	a.failed = 0
	return nil, nil
}

// jitter returns a uniform duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}
