package cas

import (
	"context"
	"fmt"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
)

// DynamoDBAPI is what DynamoDBBackend needs from a *dynamodb.Client, narrow
// so tests can inject faults. It may grow in later versions.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
}

// The attributes of a DynamoDBBackend item. The table's partition key is a
// string named by the keyAttr argument of NewDynamoDBBackend.
const (
	DynamoVersionAttr = "version" // number, from 1
	DynamoValueAttr   = "value"   // binary
)

// DynamoDBBackend stores records as items of a DynamoDB table, each write
// conditioned on the version attribute. Reads are strongly consistent.
//
// Conditional writes are retried by the SDK only after an attempt that
// proves nothing was applied (throttling, a failed dial: see
// ddberr.NoBlindRetries), never blindly: a retried write that had in fact
// applied would fail its own condition and look like a conflict, and the
// Store would apply the caller's function twice. A write whose response is
// lost is reported as ErrAmbiguousCommit instead.
type DynamoDBBackend struct {
	client       DynamoDBAPI
	table, keyAt string
}

// NewDynamoDBBackend returns a Backend on table, whose string partition key
// is keyAttr.
func NewDynamoDBBackend(client DynamoDBAPI, table, keyAttr string) (*DynamoDBBackend, error) {
	if ddbarg.NilClient(client) {
		return nil, invalid("client is nil")
	}
	if err := ddbarg.Table("table", table); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := ddbarg.Attr("key attribute", keyAttr, ddbarg.MaxKeyAttrLen); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch keyAttr {
	case DynamoValueAttr, DynamoVersionAttr:
		return nil, invalid("key attribute %q is one of the record's own attributes", keyAttr)
	}
	return &DynamoDBBackend{client: client, table: table, keyAt: keyAttr}, nil
}

// MaxValue leaves room for the key and version in DynamoDB's 400 KB item.
func (d *DynamoDBBackend) MaxValue() int { return 400*1024 - MaxKeyLen - 64 }

func (d *DynamoDBBackend) key(key string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{d.keyAt: &types.AttributeValueMemberS{Value: key}}
}

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// Get implements Backend.
func (d *DynamoDBBackend) Get(ctx context.Context, key string) ([]byte, int64, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, 0, err
	}
	out, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: &d.table, Key: d.key(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, 0, fmt.Errorf("cas: get %q: %w", key, err)
	}
	if out.Item == nil {
		return nil, 0, ErrNotFound
	}
	val, ok1 := out.Item[DynamoValueAttr].(*types.AttributeValueMemberB)
	ver, ok2 := out.Item[DynamoVersionAttr].(*types.AttributeValueMemberN)
	if !ok1 || !ok2 {
		return nil, 0, fmt.Errorf("cas: get %q: item lacks %s or %s", key, DynamoValueAttr, DynamoVersionAttr)
	}
	v, err := strconv.ParseInt(ver.Value, 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("cas: get %q: version %q: %w", key, ver.Value, err)
	}
	return val.Value, v, nil
}

// Create implements Backend.
func (d *DynamoDBBackend) Create(ctx context.Context, key string, value []byte) error {
	if err := notSent(ctx, "create", key); err != nil {
		return err
	}
	item := d.key(key)
	item[DynamoVersionAttr] = num(1)
	item[DynamoValueAttr] = &types.AttributeValueMemberB{Value: value}
	_, err := d.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: &d.table, Item: item,
		ConditionExpression:      aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": d.keyAt},
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return ErrExists
	}
	if err != nil {
		return fmt.Errorf("cas: create %q: %w", key, dynamoAmbiguous(err))
	}
	return nil
}

// Put implements Backend.
func (d *DynamoDBBackend) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := notSent(ctx, "put", key); err != nil {
		return 0, err
	}
	out, err := d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &d.table, Key: d.key(key),
		UpdateExpression:          aws.String("SET #val = :val, #ver = #ver + :one"),
		ConditionExpression:       aws.String("#ver = :ver"),
		ExpressionAttributeNames:  map[string]string{"#val": DynamoValueAttr, "#ver": DynamoVersionAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":val": &types.AttributeValueMemberB{Value: value}, ":one": num(1), ":ver": num(version)},
		ReturnValues:              types.ReturnValueUpdatedNew,
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return 0, d.whyRefused(ctx, key)
	}
	if err != nil {
		return 0, fmt.Errorf("cas: put %q: %w", key, dynamoAmbiguous(err))
	}
	ver, ok := out.Attributes[DynamoVersionAttr].(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("cas: put %q: no new version returned", key)
	}
	return strconv.ParseInt(ver.Value, 10, 64)
}

// Delete implements Backend.
func (d *DynamoDBBackend) Delete(ctx context.Context, key string, version int64) error {
	if err := notSent(ctx, "delete", key); err != nil {
		return err
	}
	_, err := d.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &d.table, Key: d.key(key),
		ConditionExpression:       aws.String("#ver = :ver"),
		ExpressionAttributeNames:  map[string]string{"#ver": DynamoVersionAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":ver": num(version)},
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return d.whyRefused(ctx, key)
	}
	if err != nil {
		return fmt.Errorf("cas: delete %q: %w", key, dynamoAmbiguous(err))
	}
	return nil
}

// whyRefused tells a conflict from a missing item after a failed condition,
// with a consistent read (not every server returns the item on failure).
func (d *DynamoDBBackend) whyRefused(ctx context.Context, key string) error {
	_, _, err := d.Get(ctx, key)
	if err == nil {
		return ErrConflict
	}
	return err
}

// dynamoAmbiguous wraps err with ErrAmbiguousCommit unless it proves the
// write was not applied (ddberr.NotApplied): a lost response, a timeout or
// a server fault may follow an applied write.
func dynamoAmbiguous(err error) error {
	if ddberr.NotApplied(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
}
