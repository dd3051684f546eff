package dynamolock

import (
	"context"
	"errors"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddberr"
)

// beat is the result of one heartbeat call.
type beat struct {
	s   sent
	err error
}

// beats is the state of a Lock's heartbeat goroutine (run); only that
// goroutine touches it.
type beats struct {
	l     *Lock
	ctx   context.Context // cancelled when the heartbeats must stop
	retry backoff.Policy  // delays after failed heartbeats
	next  time.Time       // when the next heartbeat is due
	maxAt time.Time       // the end of the maximum hold; zero: none

	results    chan beat          // the answer of the heartbeat in flight
	cancelCall context.CancelFunc // non-nil while a heartbeat is in flight
	callAt     time.Time          // when it was started
	failures   int                // heartbeats in a row that failed
	last       error              // the last one's error; nil after one that applied
}

// run is the heartbeat goroutine: it writes a new RVN every heartbeat
// period, watches the local validity and the maximum hold, and ends the
// lock when one of them runs out or a heartbeat is refused. A heartbeat
// call runs in its own goroutine, so a slow one delays neither the warning
// nor the end of the lock, and is cut off after callTimeout, so one whose
// answer never comes is retried (conditional on its RVN too) well within
// the lease. When it returns, no heartbeat is in flight.
func (l *Lock) run(ctx context.Context) {
	defer l.c.wg.Done()
	defer close(l.done)
	hb := l.c.cfg.heartbeat
	b := &beats{l: l, ctx: ctx, next: l.start.Add(hb), results: make(chan beat, 1),
		retry: backoff.Policy{Base: max(hb/8, time.Millisecond), Cap: max(hb/2, time.Millisecond)}}
	if l.ac.maxHold > 0 {
		b.maxAt = l.start.Add(l.ac.maxHold)
	}
	defer b.settle()
	for {
		now := l.c.cfg.now()
		l.mu.Lock()
		valid, warned := l.validUntil, l.warned
		l.mu.Unlock()
		if !b.maxAt.IsZero() && !now.Before(b.maxAt) {
			b.endMaxHold()
			return
		}
		warnAt := b.warnAt(valid)
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
			b.expire(now)
			return
		}
		if b.cancelCall == nil && !now.Before(b.next) && !b.start(now, valid) {
			return
		}
		if !b.wait(now, b.wake(valid, warnAt, warned)) {
			return
		}
	}
}

// settle cancels the heartbeat in flight, if any, and waits for it, so
// that the RVNs it may have written are known.
func (b *beats) settle() {
	if b.cancelCall != nil {
		b.cancelCall()
		<-b.results
		b.ended()
	}
}

// ended records that the heartbeat in flight has answered.
func (b *beats) ended() {
	b.cancelCall = nil
	b.l.mu.Lock()
	b.l.inFlight = false
	b.l.mu.Unlock()
}

// endMaxHold ends the lock at its maximum hold: Lost first, then the
// release, written once no heartbeat is in flight (waiting at most a
// lease).
func (b *beats) endMaxHold() {
	l := b.l
	l.lose(&LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: MaxHold})
	b.settle()
	rctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.lease)
	l.releaseItem(rctx)
	cancel()
}

// expire ends the lock whose local validity ran out at now, with the last
// heartbeat's error; a heartbeat still on the wire is named as having had
// no answer (DynamoDB, or the way to it, hangs), so that the loss does not
// read like a paused process.
func (b *beats) expire(now time.Time) {
	last := b.last
	if b.cancelCall != nil {
		hung := errfmt.Errorf("dynamolock: a heartbeat sent %v before the lease ran out had no answer: %w",
			now.Sub(b.callAt).Round(time.Millisecond), context.DeadlineExceeded)
		if last != nil {
			hung = errfmt.Errorf("%w (the heartbeat before it failed: %w)", hung, last)
		}
		last = hung
	}
	l := b.l
	l.lose(&LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: Expired, Last: last})
}

// warnAt returns when Expiring is due: the warning margin before the end
// of the local validity or of the maximum hold, whichever is first.
func (b *beats) warnAt(valid time.Time) time.Time {
	w := b.l.c.cfg.warning
	warnAt := valid.Add(-w)
	if !b.maxAt.IsZero() && b.maxAt.Add(-w).Before(warnAt) {
		warnAt = b.maxAt.Add(-w)
	}
	return warnAt
}

// start sends a heartbeat in its own goroutine, unless Release has begun
// (then it returns false: the heartbeats end).
func (b *beats) start(now, valid time.Time) bool {
	l := b.l
	l.mu.Lock()
	stopping := l.stopping
	l.inFlight = !stopping
	l.mu.Unlock()
	if stopping {
		return false
	}
	var callCtx context.Context
	callCtx, b.cancelCall = context.WithCancel(b.ctx)
	b.callAt = now
	go func() {
		s, err := l.heartbeat(callCtx, valid)
		b.results <- beat{s, err}
	}()
	return true
}

// wake returns when run must next look: the end of the local validity,
// the next heartbeat (unless one is in flight), the maximum hold, or the
// warning, whichever is first.
func (b *beats) wake(valid, warnAt time.Time, warned bool) time.Time {
	wake := valid
	if b.cancelCall == nil && b.next.Before(wake) {
		wake = b.next
	}
	if !b.maxAt.IsZero() && b.maxAt.Before(wake) {
		wake = b.maxAt
	}
	if !warned && warnAt.Before(wake) {
		wake = warnAt
	}
	return wake
}

// wait waits until wake or the answer of the heartbeat in flight, and
// handles that answer: a *LostError ends the lock; a failure schedules a
// retry after a growing backoff; a confirmed write schedules the next
// heartbeat a period after it was sent. It returns false when the
// heartbeats must end.
func (b *beats) wait(now, wake time.Time) bool {
	t := time.NewTimer(wake.Sub(now))
	defer t.Stop()
	select {
	case <-b.ctx.Done():
		return false
	case <-t.C:
		return true
	case r := <-b.results:
		b.cancelCall()
		b.ended()
		l := b.l
		var le *LostError
		switch {
		case errors.As(r.err, &le):
			l.lose(le)
			return false
		case r.err != nil:
			b.failures++
			b.last = r.err
			b.next = l.c.cfg.now().Add(b.retry.Delay(b.failures + 2))
			l.c.log.Debug("dynamolock: heartbeat failed; retrying", "key", lockName(l.ac.key, l.ac.sortKey), "err", r.err)
			l.event(EventRenewFailed, l.c.cfg.now().Sub(b.callAt), r.err)
		default:
			b.failures = 0
			b.last = nil
			l.event(EventRenewed, l.c.cfg.now().Sub(r.s.at), nil)
			b.next = r.s.at.Add(l.c.cfg.heartbeat)
		}
		return true
	}
}

// heartbeat writes a new RVN conditional on one of ours, waiting for the
// answer at most until valid or callTimeout. It returns the write when it
// is known to have applied (its answer, or a read that finds it); a
// *LostError when the item carries another client's RVN (or is released or
// gone); any other error when the outcome is unknown (the write stays
// pending: a later heartbeat's condition accepts it) or the write was not
// sent or refused (it is forgotten). Local validity is extended only by a
// write known to have applied.
func (l *Lock) heartbeat(ctx context.Context, valid time.Time) (sent, error) {
	c := l.c
	s := sent{rvn: newRVN(), at: c.cfg.now()}
	l.mu.Lock()
	cond := l.rvnsLocked()
	l.pending = append(l.pending, s)
	if len(l.pending) > maxPending {
		l.pending = l.pending[len(l.pending)-maxPending:]
	}
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, min(valid.Sub(s.at), c.cfg.callTimeout()))
	defer cancel()
	values := map[string]types.AttributeValue{":new": str(s.rvn), ":lease": str(formatLease(c.cfg.lease))}
	_, err := c.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(c.table), Key: c.itemKey(l.ac),
		UpdateExpression:                    aws.String("SET #rvn = :new, #lease = :lease"),
		ConditionExpression:                 aws.String(rvnIn(cond, values) + " AND attribute_not_exists(#rel)"),
		ExpressionAttributeNames:            map[string]string{"#rvn": RVNAttr, "#lease": LeaseAttr, "#rel": ReleasedAttr},
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, ddberr.NoBlindRetries)
	if err == nil {
		l.confirm(s)
		return s, nil
	}
	item, ccf := ddberr.ConditionFailed(err)
	if !ccf && ddberr.NotApplied(err) {
		l.mu.Lock()
		l.pending = drop(l.pending, s.rvn) // not sent, or refused: it never applied
		l.mu.Unlock()
		return sent{}, err
	}
	if ctx.Err() != nil {
		return sent{}, err // stopped, or out of validity: nothing to gain from a read
	}
	if item == nil {
		it, rerr := c.get(ctx, l.ac)
		if rerr != nil {
			return sent{}, errfmt.Errorf("%w; reading the item back: %w", err, rerr)
		}
		item = it
	}
	rec := parseItem(item)
	l.mu.Lock()
	cur := l.rvn
	p, isPending := find(l.pending, rec.rvn)
	l.mu.Unlock()
	switch {
	case rec.exists && !rec.released && isPending:
		l.confirm(p) // a write of ours applied after all
		return p, nil
	case rec.exists && !rec.released && rec.rvn == cur.rvn && !ccf:
		return sent{}, err // not applied (yet); it may still apply, so it stays pending
	}
	return sent{}, &LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: TakenOver, Owner: rec.owner}
}

// confirm records that write s applied: it becomes the lock's RVN, the
// writes sent before it can no longer apply (their conditions name older
// RVNs only), and local validity extends to s.at plus the lease.
func (l *Lock) confirm(s sent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.at.After(l.rvn.at) || s.rvn == l.rvn.rvn {
		l.rvn = s
	}
	keep := l.pending[:0]
	for _, p := range l.pending {
		if p.at.After(s.at) {
			keep = append(keep, p)
		}
	}
	l.pending = keep
	if v := s.at.Add(l.c.cfg.lease); v.After(l.validUntil) {
		l.validUntil = v
	}
}
