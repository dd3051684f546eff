package dynamocas

import (
	"context"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/option"
)

// DynamoDBAPI is what Backend needs from a *dynamodb.Client, narrow
// so tests can inject faults. It may grow in later versions.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, in *dynamodb.PutItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
}

// The attributes of a Backend item, beside its key attributes
// (WithKeyAttributes).
const (
	VersionAttr = "version" // number, from 1
	ValueAttr   = "value"   // binary
)

// SortKeyValue is every record's sort key value on a table with a sort
// key (WithKeyAttributes), so a Backend can share a table with other
// items.
const SortKeyValue = "nolock-cas"

// Backend stores records as items of a DynamoDB table, each write
// conditioned on the version attribute. Reads are strongly consistent.
//
// Conditional writes are retried by the SDK only after an attempt that
// proves nothing was applied (throttling, a failed dial), never blindly:
// a retried write that had in fact
// applied would fail its own condition and look like a conflict, and the
// Store would apply the caller's function twice. A write whose response is
// lost is reported as cas.ErrAmbiguousCommit instead.
type Backend struct {
	client        DynamoDBAPI
	table, pk, sk string
}

// Option changes a Backend's setting from its default: WithKeyAttributes.
type Option func(*config)

type config struct{ pk, sk string }

// WithKeyAttributes names the table's partition key attribute (a string;
// default "pk") and its sort key attribute (a string; "" for none, the
// default; with one, records use the sort key value SortKeyValue).
func WithKeyAttributes(partition, sort string) Option {
	return func(c *config) { c.pk, c.sk = partition, sort }
}

// NewBackend returns a Backend on table. A nil client or option, a table
// name DynamoDB refuses, or key attribute names that are empty, equal or
// one of VersionAttr and ValueAttr are cas.ErrInvalid, naming it.
func NewBackend(client DynamoDBAPI, table string, opts ...Option) (*Backend, error) {
	if ddbarg.NilClient(client) {
		return nil, casstore.Invalid("client is nil")
	}
	cfg := config{pk: "pk"}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", cas.ErrInvalid, err)
	}
	if err := ddbarg.Table("table", table); err != nil {
		return nil, errfmt.Errorf("%w: %w", cas.ErrInvalid, err)
	}
	if err := ddbarg.KeyAttributes(cfg.pk, cfg.sk, ValueAttr, VersionAttr); err != nil {
		return nil, errfmt.Errorf("%w: %w", cas.ErrInvalid, err)
	}
	return &Backend{client: client, table: table, pk: cfg.pk, sk: cfg.sk}, nil
}

// MaxValue leaves room for the key attributes and the version in
// DynamoDB's 400 KB item.
func (d *Backend) MaxValue() int {
	return 400*1024 - cas.MaxKeyLen - len(d.pk) - len(d.sk) - len(SortKeyValue) - 64
}

func (d *Backend) key(key string) map[string]types.AttributeValue {
	k := map[string]types.AttributeValue{d.pk: &types.AttributeValueMemberS{Value: key}}
	if d.sk != "" {
		k[d.sk] = &types.AttributeValueMemberS{Value: SortKeyValue}
	}
	return k
}

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// Get implements cas.Backend.
func (d *Backend) Get(ctx context.Context, key string) ([]byte, int64, error) {
	if err := casstore.CheckCtx(ctx); err != nil {
		return nil, 0, err
	}
	out, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: &d.table, Key: d.key(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, 0, errfmt.Errorf("cas: get %q: %w", key, err)
	}
	if out.Item == nil {
		return nil, 0, cas.ErrNotFound
	}
	val, ok1 := out.Item[ValueAttr].(*types.AttributeValueMemberB)
	ver, ok2 := out.Item[VersionAttr].(*types.AttributeValueMemberN)
	if !ok1 || !ok2 {
		return nil, 0, errfmt.Errorf("cas: get %q: item lacks %s or %s", key, ValueAttr, VersionAttr)
	}
	v, err := strconv.ParseInt(ver.Value, 10, 64)
	if err != nil {
		return nil, 0, errfmt.Errorf("cas: get %q: version %q: %w", key, ver.Value, err)
	}
	return val.Value, v, nil
}

// Create implements cas.Backend.
func (d *Backend) Create(ctx context.Context, key string, value []byte) error {
	if err := casstore.NotSent(ctx, "create", key); err != nil {
		return err
	}
	item := d.key(key)
	item[VersionAttr] = num(1)
	item[ValueAttr] = &types.AttributeValueMemberB{Value: value}
	_, err := d.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: &d.table, Item: item,
		ConditionExpression:      aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": d.pk},
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return cas.ErrExists
	}
	if err != nil {
		return errfmt.Errorf("cas: create %q: %w", key, ambiguous(err))
	}
	return nil
}

// Put implements cas.Backend.
func (d *Backend) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := casstore.NotSent(ctx, "put", key); err != nil {
		return 0, err
	}
	out, err := d.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: &d.table, Key: d.key(key),
		UpdateExpression:          aws.String("SET #val = :val, #ver = #ver + :one"),
		ConditionExpression:       aws.String("#ver = :ver"),
		ExpressionAttributeNames:  map[string]string{"#val": ValueAttr, "#ver": VersionAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":val": &types.AttributeValueMemberB{Value: value}, ":one": num(1), ":ver": num(version)},
		ReturnValues:              types.ReturnValueUpdatedNew,
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return 0, d.whyRefused(ctx, key)
	}
	if err != nil {
		return 0, errfmt.Errorf("cas: put %q: %w", key, ambiguous(err))
	}
	ver, ok := out.Attributes[VersionAttr].(*types.AttributeValueMemberN)
	if !ok {
		return 0, errfmt.Errorf("cas: put %q: no new version returned", key)
	}
	return strconv.ParseInt(ver.Value, 10, 64)
}

// Delete implements cas.Backend.
func (d *Backend) Delete(ctx context.Context, key string, version int64) error {
	if err := casstore.NotSent(ctx, "delete", key); err != nil {
		return err
	}
	_, err := d.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
		TableName: &d.table, Key: d.key(key),
		ConditionExpression:       aws.String("#ver = :ver"),
		ExpressionAttributeNames:  map[string]string{"#ver": VersionAttr},
		ExpressionAttributeValues: map[string]types.AttributeValue{":ver": num(version)},
	}, ddberr.NoBlindRetries)
	if _, failed := ddberr.ConditionFailed(err); failed {
		return d.whyRefused(ctx, key)
	}
	if err != nil {
		return errfmt.Errorf("cas: delete %q: %w", key, ambiguous(err))
	}
	return nil
}

// whyRefused tells a conflict from a missing item after a failed condition,
// with a consistent read (not every server returns the item on failure).
func (d *Backend) whyRefused(ctx context.Context, key string) error {
	_, _, err := d.Get(ctx, key)
	if err == nil {
		return cas.ErrConflict
	}
	return err
}

// ambiguous wraps err with cas.ErrAmbiguousCommit unless it proves the
// write was not applied (ddberr.NotApplied): a lost response, a timeout or
// a server fault may follow an applied write.
func ambiguous(err error) error {
	if ddberr.NotApplied(err) {
		return err
	}
	return errfmt.Errorf("%w: %w", cas.ErrAmbiguousCommit, err)
}
