package dynamolock

import (
	"context"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/ddberr"
)

// backend is what the lock core needs from a Client: its writes.
type backend struct{ c *Client }

// Renew sends the heartbeat of one lock (the core renews each lock with a
// call of its own, at its own time, and bounds the call).
func (b backend) Renew(ctx context.Context, hs []*lockcore.Hold) []lockcore.Renewed {
	out := make([]lockcore.Renewed, len(hs))
	for i, h := range hs {
		s, err := h.Ref.(*Lock).heartbeat(ctx)
		out[i] = lockcore.Renewed{At: s.at, Valid: s.at.Add(b.c.cfg.Lease), Err: err}
	}
	return out
}

// Release writes h's release, conditional on every RVN of ours the item
// may carry (no heartbeat is in flight: the core waited for it).
func (b backend) Release(ctx context.Context, h *lockcore.Hold) error {
	l := h.Ref.(*Lock)
	l.mu.Lock()
	rvns := l.rvnsLocked()
	l.mu.Unlock()
	return b.c.writeRelease(ctx, l.ac, rvns)
}

// Lost returns the *LostError of a loss of h.
func (b backend) Lost(h *lockcore.Hold, loss *lockcore.Loss) error {
	l := h.Ref.(*Lock)
	return &LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: Cause(loss.Cause), Owner: loss.Owner, Token: loss.Token, Last: loss.Last}
}

// heartbeat writes a new RVN conditional on one of ours, waiting for the
// answer until ctx ends (the core bounds it). It returns the write when it
// is known to have applied (its answer, or a read that finds it); a
// *lockcore.Loss when the item carries another client's RVN (or is
// released or gone); any other error when the outcome is unknown (the write stays
// pending: a later heartbeat's condition accepts it) or the write was not
// sent or refused (it is forgotten). Local validity is extended only by a
// write known to have applied.
func (l *Lock) heartbeat(ctx context.Context) (sent, error) {
	c := l.c
	s := sent{rvn: newRVN(), at: c.cfg.Now()}
	l.mu.Lock()
	cond := l.rvnsLocked()
	l.pending = append(l.pending, s)
	if len(l.pending) > maxPending {
		l.pending = l.pending[len(l.pending)-maxPending:]
	}
	l.mu.Unlock()

	values := map[string]types.AttributeValue{":new": str(s.rvn), ":lease": str(formatLease(c.cfg.Lease))}
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
		return s, err
	}
	if ctx.Err() != nil {
		return s, err // stopped, or out of time: nothing to gain from a read
	}
	if item == nil {
		it, rerr := c.get(ctx, l.ac)
		if rerr != nil {
			return s, errfmt.Errorf("%w; reading the item back: %w", err, rerr)
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
		return s, err // not applied (yet); it may still apply, so it stays pending
	}
	return s, &lockcore.Loss{Cause: lockcore.TakenOver, Owner: rec.owner, Token: rec.token}
}

// confirm records that write s applied: it becomes the lock's RVN, and
// the writes sent before it can no longer apply (their conditions name
// older RVNs only). The core extends the local validity to s.at plus the
// lease.
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
}
