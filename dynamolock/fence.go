package dynamolock

import (
	"context"
	"maps"
	"strings"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
)

// Placeholders the fencing helpers add to a caller's expressions.
const (
	fenceName  = "#nolockFence"
	fenceValue = ":nolockToken"
	lockTok    = "#nolockLockToken"
	lockTokV   = ":nolockLockToken"
	lockRel    = "#nolockLockReleased"
)

// Fence guards a write to one of your own DynamoDB items with a fencing
// token: the write applies only if the item's fence attribute is absent or
// at most the token, and it stores the token there. A holder paused past
// its lease whose lock was taken over carries a lower token than the new
// holder's first fenced write stored, so its write is refused (a
// ConditionalCheckFailedException). Equal tokens pass: one holder writes
// many times.
//
// Use the pieces in your own request (Condition ANDed into your condition,
// Set into your SET clause, Names and Values merged into yours), or let
// ApplyUpdate and ApplyPut do it. Every write path to the item must be
// fenced; one unguarded path reopens the window. A Fence is a value, safe
// for concurrent use; it does not check that the token is current (a
// token above every issued one passes, and then fences out all others).
type Fence struct {
	// Condition is "(attribute_not_exists(#nolockFence) OR #nolockFence <= :nolockToken)".
	Condition string
	// Set is "#nolockFence = :nolockToken", for an UpdateItem's SET clause.
	Set string
	// Names and Values hold the placeholders' meanings; each Fence has its
	// own maps.
	Names  map[string]string
	Values map[string]types.AttributeValue

	attr  string
	token int64
}

// NewFence returns the fence for writes carrying token into the number
// attribute attr of your items.
func NewFence(attr string, token int64) (Fence, error) {
	switch {
	case attr == "" || len(attr) > 64*1024:
		return Fence{}, invalid("fence attribute name must be 1 to 65536 bytes")
	case token < 0:
		return Fence{}, invalid("token %d is negative", token)
	}
	return Fence{
		Condition: "(attribute_not_exists(" + fenceName + ") OR " + fenceName + " <= " + fenceValue + ")",
		Set:       fenceName + " = " + fenceValue,
		Names:     map[string]string{fenceName: attr},
		Values:    map[string]types.AttributeValue{fenceValue: num(token)},
		attr:      attr, token: token,
	}, nil
}

// Fence returns the fence for this lock's token on attr. It refuses (with
// ErrInvalid) a lock of a Client made WithoutFencing, whose token is 0.
func (l *Lock) Fence(attr string) (Fence, error) {
	if !l.c.cfg.fencing {
		return Fence{}, invalid("the Client was made WithoutFencing: no token to fence with")
	}
	return NewFence(attr, l.token)
}

// ApplyUpdate adds the fence to an UpdateItem request in place: its
// condition is ANDed with yours, the token is assigned in your SET clause
// (one is added if there is none), and the placeholders are merged into
// copies of your maps. It returns ErrInvalid if your request already uses
// one of the fence's placeholders.
func (f Fence) ApplyUpdate(in *dynamodb.UpdateItemInput) error {
	names, values, err := f.merge(in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return err
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = names, values
	in.ConditionExpression = aws.String(and(aws.ToString(in.ConditionExpression), f.Condition))
	in.UpdateExpression = aws.String(addSet(aws.ToString(in.UpdateExpression), f.Set))
	return nil
}

// ApplyPut adds the fence to a PutItem request in place: the token goes
// into a copy of the item, and the condition is ANDed with yours.
func (f Fence) ApplyPut(in *dynamodb.PutItemInput) error {
	names, values, err := f.merge(in.ExpressionAttributeNames, in.ExpressionAttributeValues)
	if err != nil {
		return err
	}
	item := maps.Clone(in.Item)
	if item == nil {
		item = map[string]types.AttributeValue{}
	}
	item[f.attr] = num(f.token)
	in.Item, in.ExpressionAttributeNames, in.ExpressionAttributeValues = item, names, values
	in.ConditionExpression = aws.String(and(aws.ToString(in.ConditionExpression), f.Condition))
	return nil
}

func (f Fence) merge(names map[string]string, values map[string]types.AttributeValue) (map[string]string, map[string]types.AttributeValue, error) {
	if _, ok := names[fenceName]; ok {
		return nil, nil, invalid("expression attribute name %s is already used", fenceName)
	}
	if _, ok := values[fenceValue]; ok {
		return nil, nil, invalid("expression attribute value %s is already used", fenceValue)
	}
	n := maps.Clone(names)
	if n == nil {
		n = map[string]string{}
	}
	v := maps.Clone(values)
	if v == nil {
		v = map[string]types.AttributeValue{}
	}
	maps.Copy(n, f.Names)
	maps.Copy(v, f.Values)
	return n, v, nil
}

func and(a, b string) string {
	if strings.TrimSpace(a) == "" {
		return b
	}
	return "(" + a + ") AND " + b
}

// addSet adds assignment to the SET clause of an update expression, or adds
// a SET clause. SET is a reserved word, so outside placeholders it can only
// be the clause keyword.
func addSet(expr, assignment string) string {
	depth := 0
	for i := 0; i < len(expr); {
		ch := expr[i]
		switch {
		case ch == '(':
			depth++
			i++
		case ch == ')':
			depth--
			i++
		case isWord(ch):
			j := i
			for j < len(expr) && isWord(expr[j]) {
				j++
			}
			placeholder := i > 0 && (expr[i-1] == '#' || expr[i-1] == ':' || expr[i-1] == '.')
			if depth == 0 && !placeholder && strings.EqualFold(expr[i:j], "SET") {
				return expr[:j] + " " + assignment + "," + expr[j:]
			}
			i = j
		default:
			i++
		}
	}
	if strings.TrimSpace(expr) == "" {
		return "SET " + assignment
	}
	return expr + " SET " + assignment
}

func isWord(ch byte) bool {
	return ch == '_' || ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z'
}

// ConditionCheck returns a TransactWriteItems action that holds only while
// this lock's token is still the lock item's and the lock is not released:
// put it into a transaction with your writes (to items other than the lock
// item), and they apply only if no newer holder has acquired the lock
// since. Heartbeats do not change the token, so the check does not race
// them. It refuses (ErrInvalid) a lock of a Client made WithoutFencing.
//
// The check passes for a holder whose lease has run out if nobody has
// acquired the lock since: nobody else could have written under it.
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
