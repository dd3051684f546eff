package dynamolock

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
)

// Placeholders of the lock item's names and values in ConditionCheck.
const (
	lockTok  = "#nolockLockToken"
	lockTokV = ":nolockLockToken"
	lockRel  = "#nolockLockReleased"
)

// ConditionCheck returns a TransactWriteItems action that holds only while
// this lock's token is still the lock item's and the lock is not released:
// put it into a transaction with your writes (to items other than the lock
// item), and they apply only if no newer holder has acquired the lock
// since. Heartbeats do not change the token, so the check does not race
// them. It refuses (ErrInvalid) a lock of a Client made WithoutFencing.
//
// The check passes for a holder whose lease has run out if nobody has
// acquired the lock since: nobody else could have written under it.
//
// To fence your own DynamoDB items without a transaction, store the token
// with each write instead: dynamoconditional.Fenced with Token, the
// library's one fence for DynamoDB items.
func (l *Lock) ConditionCheck() (types.TransactWriteItem, error) {
	if !l.c.cfg.fencing {
		return types.TransactWriteItem{}, invalid("the Client was made WithoutFencing: no token to check")
	}
	return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
		TableName:                 aws.String(l.c.table),
		Key:                       l.c.itemKey(l.ac),
		ConditionExpression:       aws.String(lockTok + " = " + lockTokV + " AND attribute_not_exists(" + lockRel + ")"),
		ExpressionAttributeNames:  map[string]string{lockTok: TokenAttr, lockRel: ReleasedAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{lockTokV: num(l.token)},
	}}, nil
}

// TransactAPI is what (*Lock).Transact needs: a *dynamodb.Client satisfies
// it. It may grow in later versions.
type TransactAPI interface {
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// Transact runs items in one TransactWriteItems with the lock's
// ConditionCheck first, so they apply only while no newer holder exists.
// When that check fails it returns an error wrapping ErrFenced and nothing
// was written; any other cancellation or error is returned as the SDK gave
// it. The SDK retries the request only after an attempt that changed
// nothing (throttling, a failed dial), never after one whose answer was
// lost: an error without an HTTP 4xx status (a 5xx, a timeout, a lost
// connection), unless no connection was made, leaves the outcome unknown.
func (l *Lock) Transact(ctx context.Context, api TransactAPI, items ...types.TransactWriteItem) error {
	switch {
	case ctx == nil:
		return invalid("ctx is nil")
	case ddbarg.NilClient(api):
		return invalid("transaction client is nil")
	}
	check, err := l.ConditionCheck()
	if err != nil {
		return err
	}
	_, err = api.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: append([]types.TransactWriteItem{check}, items...),
	}, ddberr.NoBlindRetries)
	if ddberr.ConditionFailedAt(err, 0) {
		return errfmt.Errorf("dynamolock: transaction under %s with token %d: %w", lockName(l.ac.key, l.ac.sortKey), l.token, ErrFenced)
	}
	return err
}
