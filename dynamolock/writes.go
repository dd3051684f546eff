package dynamolock

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
)

// The requests a Client sends for a lock item: the acquiring write, the
// consistent read, and the release. Heartbeats are in heartbeat.go. Every
// write goes out with ddberr.NoBlindRetries, so the SDK retries it only
// after an attempt that changed nothing, and its error is classified by
// ddberr.Of.

// sent is a write this client sent, with the RVN it carried and when.
type sent struct {
	rvn string
	at  time.Time
}

// newRVN returns a fresh record version number: a random UUID in its
// text form, as AWS's Java lock client writes them.
func newRVN() string { return uuid.NewString() }

// find returns the write of ss that carried rvn, if any.
func find(ss []sent, rvn string) (sent, bool) {
	for _, s := range ss {
		if s.rvn == rvn && rvn != "" {
			return s, true
		}
	}
	return sent{}, false
}

// drop returns ss without the write that carried rvn, reusing its array.
func drop(ss []sent, rvn string) []sent {
	out := ss[:0]
	for _, s := range ss {
		if s.rvn != rvn {
			out = append(out, s)
		}
	}
	return out
}

func numAttr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

// itemKey returns the key of the lock item of ac.
func (c *Client) itemKey(ac acquireConfig) map[string]types.AttributeValue {
	k := map[string]types.AttributeValue{c.cfg.pkName: str(ac.key)}
	if c.cfg.skName != "" {
		k[c.cfg.skName] = str(ac.sortKey)
	}
	return k
}

// writeAcquire sends the acquiring write: it applies only if the item is
// absent or released, or (takeover != nil) still at the RVN *takeover. It
// sets our owner, rvn, lease and data, and adds 1 to the fencing token,
// returning the new token. It waits at most a lease for the answer.
func (c *Client) writeAcquire(ctx context.Context, ac acquireConfig, rvn string, takeover *string) (*dynamodb.UpdateItemOutput, error) {
	names := map[string]string{"#pk": c.cfg.pkName, "#own": OwnerAttr, "#rvn": RVNAttr, "#lease": LeaseAttr,
		"#rel": ReleasedAttr, "#tok": TokenAttr, "#data": DataAttr}
	values := map[string]types.AttributeValue{":own": str(c.cfg.Owner), ":rvn": str(rvn),
		":lease": str(formatLease(c.cfg.Lease)), ":relv": str(releasedValue), ":one": num(1)}
	update := "SET #own = :own, #rvn = :rvn, #lease = :lease"
	remove := " REMOVE #rel"
	if ac.data != nil {
		update += ", #data = :data"
		values[":data"] = &types.AttributeValueMemberB{Value: ac.data}
	} else {
		remove += ", #data"
	}
	update += remove + " ADD #tok :one"
	cond := "attribute_not_exists(#pk) OR #rel = :relv"
	if takeover != nil {
		if *takeover == "" {
			cond += " OR attribute_not_exists(#rvn)"
		} else {
			cond += " OR #rvn = :old"
			values[":old"] = str(*takeover)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Lease)
	defer cancel()
	return c.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(c.table), Key: c.itemKey(ac),
		UpdateExpression: aws.String(update), ConditionExpression: aws.String(cond),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		ReturnValues:                        types.ReturnValueUpdatedNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, ddberr.NoBlindRetries)
}

// get reads the lock item with a strongly consistent read (nil if absent),
// waiting at most a lease for the answer.
func (c *Client) get(ctx context.Context, ac acquireConfig) (map[string]types.AttributeValue, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Lease)
	defer cancel()
	out, err := c.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(c.table), Key: c.itemKey(ac), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}

// writeRelease releases the item if it carries one of rvns: with fencing,
// it marks the item released under a fresh RVN (kept in the condition, so
// a retry after a lost answer succeeds again); without, it deletes it. It
// returns nil once the release is known to have applied, and a
// *lockcore.Loss when another client owns the item. An attempt whose
// outcome is unknown is retried until ctx ends, so that the outcome is
// learned; each waits for its answer as lockcore.CallBound says, and the
// error when ctx ends carries the last attempt's. An attempt that changed
// nothing (not sent, or refused: the SDK has already retried throttling
// and failed dials) ends it with that error, unless an earlier attempt's
// outcome is still unknown.
func (c *Client) writeRelease(ctx context.Context, ac acquireConfig, rvns []string) error {
	name := lockName(ac.key, ac.sortKey)
	rel := newRVN()
	bo := backoff.Policy{Base: max(c.cfg.Poll/16, time.Millisecond), Cap: c.cfg.Poll}
	unknown := false // an attempt may have applied
	cut := false     // the last attempt was cut off at its bound: retry at once, with all the time left
	var last error
	for attempt := 1; ; attempt++ {
		if !cut {
			if err := backoff.Sleep(ctx, bo.Delay(attempt)); err != nil {
				return releaseEnded(name, err, last)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, lockcore.CallBound(ctx, c.cfg.Lease, cut))
		err := c.sendRelease(wctx, ac, rvns, rel)
		cut = ctx.Err() == nil && wctx.Err() != nil
		cancel()
		if err == nil {
			return nil
		}
		if last == nil || ctx.Err() == nil {
			last = err // not one cut off by ctx's end, which says less
		}
		item, ccf := ddberr.ConditionFailed(err)
		if !ccf {
			if ddberr.Permanent(err) || ddberr.NotApplied(err) && !unknown {
				return errfmt.Errorf("dynamolock: release %s: %w", name, err)
			}
			unknown = unknown || ddberr.Of(err) == ddberr.Unknown
			c.k.Log().Debug("dynamolock: release failed; retrying", "key", name, "outcome", ddberr.Of(err), "err", err)
			continue
		}
		if item == nil {
			rctx, cancel := context.WithTimeout(ctx, lockcore.CallBound(ctx, c.cfg.Lease, false))
			item, err = c.get(rctx, ac)
			cut = ctx.Err() == nil && rctx.Err() != nil
			cancel()
			if err != nil {
				unknown, last = true, err
				continue
			}
		}
		rec := parseItem(item)
		switch {
		case c.cfg.fencing && rec.rvn == rel:
			return nil // an earlier attempt applied
		case !c.cfg.fencing && !rec.exists && unknown:
			return nil // presumably ours applied; see WithoutFencing
		}
		return &lockcore.Loss{Cause: lockcore.TakenOver, Owner: rec.owner, Token: rec.token}
	}
}

// releaseEnded is a release's error when its ctx ended (end) after the
// attempts that failed with last (nil if none was made).
func releaseEnded(name string, end, last error) error {
	if last == nil {
		return errfmt.Errorf("dynamolock: release %s: %w", name, end)
	}
	return errfmt.Errorf("dynamolock: release %s: %w (last error: %w)", name, end, last)
}

// sendRelease sends one release attempt, conditional on the item carrying
// one of rvns (or, with fencing, rel, the RVN the release writes).
func (c *Client) sendRelease(ctx context.Context, ac acquireConfig, rvns []string, rel string) error {
	names := map[string]string{"#rvn": RVNAttr}
	values := map[string]types.AttributeValue{}
	if !c.cfg.fencing {
		_, err := c.api.DeleteItem(ctx, &dynamodb.DeleteItemInput{
			TableName: aws.String(c.table), Key: c.itemKey(ac),
			ConditionExpression:      aws.String(rvnIn(rvns, values)),
			ExpressionAttributeNames: names, ExpressionAttributeValues: values,
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		}, ddberr.NoBlindRetries)
		return err
	}
	names["#rel"] = ReleasedAttr
	values[":relv"] = str(releasedValue)
	values[":new"] = str(rel)
	_, err := c.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(c.table), Key: c.itemKey(ac),
		UpdateExpression:         aws.String("SET #rel = :relv, #rvn = :new"),
		ConditionExpression:      aws.String(rvnIn(append(rvns[:len(rvns):len(rvns)], rel), values)),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, ddberr.NoBlindRetries)
	return err
}
