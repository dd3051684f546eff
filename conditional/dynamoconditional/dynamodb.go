package dynamoconditional

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
)

// DynamoDBAPI is what this package needs from DynamoDB: a *dynamodb.Client
// satisfies it, and so does any wrapper of one (to count calls or inject
// faults). It may grow in later versions.
//
// Every write this package sends carries a per-call option that lets the
// SDK retry it (with its backoff) only after an attempt that changed
// nothing: throttled, or not sent because the dial failed. After any other
// error the write may have applied, and it is reported as
// ErrAmbiguousCommit, never retried blindly. A wrapper should pass the
// options on.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// Attribute names of the items Stock and Accounts keep, beside their key
// attributes (WithKeyAttributes).
const (
	// QtyAttr holds a stock bucket's units, a number never below 0.
	QtyAttr = "qty"
	// BalanceAttr holds an account's balance, a number never below 0.
	BalanceAttr = "balance"
)

// SortKeyValue is the sort key value of every item Stock, Accounts and
// Holds keep on a table with a sort key (WithKeyAttributes), so they can
// share a table with other items.
const SortKeyValue = "nolock-conditional"

// WithKeyAttributes names the table's partition key attribute (a string;
// default "pk") and its sort key attribute (a string; "" for none, the
// default; with one, items use the sort key value SortKeyValue), for
// NewStock, NewAccounts and NewHolds. The names must be valid, distinct,
// and not one of the type's own attributes (QtyAttr, BalanceAttr, the
// Hold*Attr); otherwise the constructor returns ErrInvalid naming them.
// NewFenced takes the key attribute of your own table as an argument.
func WithKeyAttributes(partition, sort string) Option {
	return func(c *config) { c.used.Add(setKeyAttributes); c.keys = keyAttrs{pk: partition, sk: sort} }
}

// keyAttrs are a table's key attribute names: pk always, sk if not "".
type keyAttrs struct{ pk, sk string }

// defaultKeys are the key attributes unless WithKeyAttributes says otherwise.
var defaultKeys = keyAttrs{pk: "pk"}

// valid checks the names against the item's own attributes.
func (k keyAttrs) valid(own ...string) error {
	if err := ddbarg.KeyAttributes(k.pk, k.sk, own...); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// item returns the key of the item whose partition key value is v.
func (k keyAttrs) item(v string) map[string]types.AttributeValue {
	key := map[string]types.AttributeValue{k.pk: strAttr(v)}
	if k.sk != "" {
		key[k.sk] = strAttr(SortKeyValue)
	}
	return key
}

// ErrConflict means every attempt lost a race with concurrent writers of
// the same items, so the request was given up: nothing was changed, and
// trying again later may succeed. Stock returns it when a take across
// buckets found its buckets changed under it on every attempt.
var ErrConflict = errors.New("conditional: conflict with concurrent writers")

// validTable checks a table name argument (see ddbarg.Table).
func validTable(arg, name string) error {
	if err := ddbarg.Table(arg, name); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// validAttr checks an attribute name argument of at most max bytes
// (see ddbarg.Attr).
func validAttr(arg, name string, max int) error {
	if err := ddbarg.Attr(arg, name, max); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// numAttr returns a number attribute value.
func numAttr(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// strAttr returns a string attribute value.
func strAttr(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// intAttr reads the integer attribute name of item.
func intAttr(item map[string]types.AttributeValue, name string) (int64, error) {
	v, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, errfmt.Errorf("conditional: item has no number attribute %q", name)
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	if err != nil {
		return 0, errfmt.Errorf("conditional: attribute %q: %w", name, err)
	}
	return n, nil
}

// getItem reads the item at key with a strongly consistent read; nil
// means there is none. projection, if not empty, names the attributes to
// return.
func getItem(ctx context.Context, client DynamoDBAPI, table string, key map[string]types.AttributeValue, projection ...string) (map[string]types.AttributeValue, error) {
	in := &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)}
	in.ProjectionExpression, in.ExpressionAttributeNames = projectionOf(projection)
	out, err := client.GetItem(ctx, in)
	if err != nil {
		return nil, err
	}
	if len(out.Item) == 0 {
		return nil, nil
	}
	return out.Item, nil
}

// projectionOf returns a projection expression of names with its
// placeholders (#p0, #p1, …), or nil and nil when names is empty.
func projectionOf(names []string) (*string, map[string]string) {
	if len(names) == 0 {
		return nil, nil
	}
	placeholders := make(map[string]string, len(names))
	expr := ""
	for i, name := range names {
		ph := "#p" + strconv.Itoa(i)
		placeholders[ph] = name
		if i > 0 {
			expr += ", "
		}
		expr += ph
	}
	return aws.String(expr), placeholders
}

// errUnprocessed: a BatchGetItem call left keys unprocessed.
var errUnprocessed = errors.New("conditional: BatchGetItem left keys unprocessed")

// batchGet reads the items whose partition key values are vs (1 to 100,
// each once: one BatchGetItem's keys) with strongly consistent reads, and
// returns each item found by its partition key value; an absent value has
// no item. Keys a call leaves unprocessed (DynamoDB throttled it, or
// bounded its answer's size) are asked again after a backoff with full
// jitter, at most backoff.DefaultAttempts calls in all; then its error
// wraps backoff.ErrExhausted. projection names the attributes wanted
// besides the key.
func batchGet(ctx context.Context, client DynamoDBAPI, table string, keys keyAttrs, vs []string, projection ...string) (map[string]map[string]types.AttributeValue, error) {
	ka := types.KeysAndAttributes{ConsistentRead: aws.Bool(true)}
	ka.ProjectionExpression, ka.ExpressionAttributeNames = projectionOf(append([]string{keys.pk}, projection...))
	for _, v := range vs {
		ka.Keys = append(ka.Keys, keys.item(v))
	}
	pending := map[string]types.KeysAndAttributes{table: ka}
	found := make(map[string]map[string]types.AttributeValue, len(vs))
	err := batchGetPolicy.Retry(ctx, func(ctx context.Context, _ int) error {
		out, err := client.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: pending})
		if err != nil {
			return err
		}
		for _, item := range out.Responses[table] {
			if v, ok := item[keys.pk].(*types.AttributeValueMemberS); ok {
				found[v.Value] = item
			}
		}
		if len(out.UnprocessedKeys[table].Keys) > 0 {
			pending = out.UnprocessedKeys
			return errUnprocessed
		}
		return nil
	}, func(err error) bool { return errors.Is(err, errUnprocessed) }, nil)
	if err != nil {
		return nil, err
	}
	return found, nil
}

// batchGetPolicy spaces the calls that ask again for unprocessed keys.
var batchGetPolicy = backoff.Policy{Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond}

// ConditionFailedAt reports whether err is a TransactWriteItems
// cancellation in which the action at index i (of the TransactItems sent)
// failed its condition, for example the DebitItem or CheckItem a caller put
// into its own transaction. A transaction cancelled for any reason applied
// nothing.
func ConditionFailedAt(err error, i int) bool { return ddberr.ConditionFailedAt(err, i) }

// writeErr classifies the error of a write that failed for another
// reason than a failed condition. A write the server refused, or that never
// left for the server, is returned as is. Any other error (a 5xx answer, a
// connection lost or a timeout after the request was sent, a cancelled
// context, an error from a wrapping client) leaves the outcome unknown: the
// write may have applied, so it is ErrAmbiguousCommit.
func writeErr(err error) error {
	if ddberr.NotApplied(err) {
		return err
	}
	return errfmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
}

// unsupported reports whether the server does not know the operation, as
// dynalite answers TransactWriteItems.
func unsupported(err error) bool {
	var api interface{ ErrorCode() string }
	return errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException"
}

// updateItem sends u, built for a transaction, as one UpdateItem, without
// the SDK's blind retries (see ddberr.NoBlindRetries).
func updateItem(ctx context.Context, client DynamoDBAPI, u *types.Update) error {
	_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: u.TableName, Key: u.Key, UpdateExpression: u.UpdateExpression,
		ConditionExpression: u.ConditionExpression, ExpressionAttributeNames: u.ExpressionAttributeNames,
		ExpressionAttributeValues:           u.ExpressionAttributeValues,
		ReturnValuesOnConditionCheckFailure: u.ReturnValuesOnConditionCheckFailure,
	}, ddberr.NoBlindRetries)
	return err
}
