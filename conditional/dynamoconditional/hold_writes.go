package dynamoconditional

// The conditional writes behind Holds: the rule of each operation as
// one update's condition, how a write is sent (retried only while a
// transaction holds its item, which applied nothing), and how a refusal is
// explained from the item the condition judged.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
)

// holdNames are the attribute names of the hold, confirm and release
// expressions, each of which uses all three.
func holdNames() map[string]string {
	return map[string]string{"#s": HoldStateAttr, "#h": HolderAttr, "#u": HoldUntilAttr}
}

// holdUpdate holds resource for holder until end (Unix ms) if it is free,
// held by holder, or held past its end by now. A missing item has no
// state, so the condition fails and no item is created.
func (h *Holds) holdUpdate(resource, holder string, now, end int64) *types.Update {
	return &types.Update{
		TableName:                aws.String(h.table),
		Key:                      h.key(resource),
		UpdateExpression:         aws.String("SET #s = :held, #h = :holder, #u = :end"),
		ConditionExpression:      aws.String("#s = :free OR (#s = :held AND (#h = :holder OR #u <= :now))"),
		ExpressionAttributeNames: holdNames(),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":free": strAttr(holdFree), ":held": strAttr(holdHeld), ":holder": strAttr(holder),
			":end": numAttr(end), ":now": numAttr(now),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// confirmUpdate confirms holder's hold if it has not ended by now; a
// resource holder confirmed already is confirmed again, a no-op.
func (h *Holds) confirmUpdate(resource, holder string, now int64) *types.Update {
	return &types.Update{
		TableName:                aws.String(h.table),
		Key:                      h.key(resource),
		UpdateExpression:         aws.String("SET #s = :confirmed REMOVE #u"),
		ConditionExpression:      aws.String("#h = :holder AND (#s = :confirmed OR (#s = :held AND #u > :now))"),
		ExpressionAttributeNames: holdNames(),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":confirmed": strAttr(holdConfirmed), ":held": strAttr(holdHeld), ":holder": strAttr(holder),
			":now": numAttr(now),
		},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// releaseUpdate frees the resource if holder holds it, expired or not.
func (h *Holds) releaseUpdate(resource, holder string) *types.Update {
	return &types.Update{
		TableName:                           aws.String(h.table),
		Key:                                 h.key(resource),
		UpdateExpression:                    aws.String("SET #s = :free REMOVE #h, #u"),
		ConditionExpression:                 aws.String("#s = :held AND #h = :holder"),
		ExpressionAttributeNames:            holdNames(),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":free": strAttr(holdFree), ":held": strAttr(holdHeld), ":holder": strAttr(holder)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// settle runs Confirm's or Release's write.
func (h *Holds) settle(ctx context.Context, op, resource string, build func(now int64) *types.Update) error {
	if err := condcore.Unsent(ctx, fmt.Sprintf("%s %q", op, resource)); err != nil {
		return err
	}
	item, refused, err := h.write(ctx, resource, build)
	switch {
	case err != nil:
		return errfmt.Errorf("conditional: %s %q: %w", op, resource, err)
	case !refused:
		return nil
	case item == nil:
		return errfmt.Errorf("conditional: %s %q: %w", op, resource, ErrNotFound)
	}
	return errfmt.Errorf("conditional: %s %q: %w", op, resource, ErrNotHolder)
}

// write sends the update build makes for the clock's reading (Unix ms) as
// one UpdateItem. On a failed condition it returns refused and the item
// the condition judged, or, when the server returned none, a strongly
// consistent read of it (nil: no item).
func (h *Holds) write(ctx context.Context, resource string, build func(now int64) *types.Update) (item map[string]types.AttributeValue, refused bool, err error) {
	err = h.retryConflicts(ctx, resource, func(ctx context.Context) error {
		u := build(h.clock().UnixMilli())
		err := updateItem(ctx, h.client, u)
		if item, refused = ddberr.ConditionFailed(err); err == nil || refused {
			return nil
		}
		return writeErr(err)
	})
	if err != nil || !refused || item != nil {
		return item, refused, err
	}
	if item, err = getItem(ctx, h.client, h.table, h.key(resource)); err != nil {
		return nil, true, errfmt.Errorf("refused; reading the item: %w", err)
	}
	return item, true, nil
}

// retryConflicts runs op, and again with jittered backoff while DynamoDB
// refuses it for a transaction in progress on one of its items (nothing
// was applied); when the attempts run out, the error wraps ErrConflict.
// key names what op writes, for the log.
func (h *Holds) retryConflicts(ctx context.Context, key string, op func(context.Context) error) error {
	err := h.retry.retry(ctx, key, op, ddberr.TransactionConflict)
	if errors.Is(err, backoff.ErrExhausted) {
		return errfmt.Errorf("%w: %w", ErrConflict, err)
	}
	return err
}

// holdRefusal says why a resource whose item is item could not be held.
func holdRefusal(item map[string]types.AttributeValue) error {
	if item == nil {
		return ErrNotFound
	}
	if s, _ := item[HoldStateAttr].(*types.AttributeValueMemberS); s != nil && s.Value == holdConfirmed {
		return ErrConfirmed
	}
	return ErrHeld
}

// validHolder checks a resource and a holder argument.
func validHolder(resource, holder string) error {
	if err := condcore.ValidArg("resource", resource); err != nil {
		return err
	}
	return condcore.ValidArg("holder", holder)
}

// validTTL checks a hold's TTL: at least the stored resolution.
func validTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return condcore.Invalid("ttl %v is below 1ms", ttl)
	}
	return nil
}

// refusal names the resource whose condition cancelled HoldAll's
// transaction: an unknown one first, else the first in sorted order. It
// returns nil when no condition failed.
func (h *Holds) refusal(ctx context.Context, err error, sorted []string) (*HoldError, error) {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return nil, nil
	}
	var first *HoldError
	for i, r := range sorted {
		if !ConditionFailedAt(err, i) {
			continue
		}
		item := tce.CancellationReasons[i].Item
		if len(item) == 0 { // none returned: read it
			var rerr error
			if item, rerr = getItem(ctx, h.client, h.table, h.key(r)); rerr != nil {
				return nil, rerr
			}
		}
		he := &HoldError{Resource: r, Err: holdRefusal(item)}
		if he.Err == ErrNotFound {
			return he, nil
		}
		if first == nil {
			first = he
		}
	}
	return first, nil
}
