// Package localdynamo is what the examples need around a DynamoDB of
// their own (a local server such as dynalite or DynamoDB Local, or a
// table in a real account): a client, a table made for one run and
// deleted after it, and a Link whose traffic can be cut, to stand for a
// process that stopped or died. It is plain AWS SDK code, the few lines
// a program would write itself; the examples share it so that they write
// it once.
package localdynamo

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Client returns a client for the DynamoDB at endpoint, in us-east-1,
// with fixed credentials: a local server takes any. For a real account,
// build the client from the SDK's config package instead.
func Client(endpoint string) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{Region: "us-east-1", BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "local", SecretAccessKey: "local"}, nil
		})})
}

// CreateTable creates an on-demand table whose partition key is a string
// named hashKey (dynamolock's default is "key"), waits until it is
// active, and returns a func that deletes it.
func CreateTable(ctx context.Context, db *dynamodb.Client, table, hashKey string) (drop func(), err error) {
	_, err = db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(hashKey), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(hashKey), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return nil, err
	}
	drop = func() {
		_, _ = db.DeleteTable(context.WithoutCancel(ctx), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	}
	err = dynamodb.NewTableExistsWaiter(db, func(o *dynamodb.TableExistsWaiterOptions) { o.MinDelay = 50 * time.Millisecond }).
		Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, time.Minute)
	if err != nil {
		drop()
		return nil, err
	}
	return drop, nil
}

// ErrCut is what a Link's calls return while it is cut.
var ErrCut = errors.New("localdynamo: link cut")

// Link is one process's connection to DynamoDB, for a dynamolock.Client
// (it has the methods of dynamolock.DynamoDBAPI). While cut, every call
// fails at once with ErrCut and reaches nothing, as a stopped process
// sends nothing (its heartbeat goroutine is stopped too) and a dead one
// never will. A Link is safe for concurrent use.
type Link struct {
	db  *dynamodb.Client
	cut atomic.Bool
}

// NewLink returns a Link to db, not cut.
func NewLink(db *dynamodb.Client) *Link { return &Link{db: db} }

// Cut cuts the link (true) or restores it (false).
func (l *Link) Cut(cut bool) { l.cut.Store(cut) }

// GetItem is db's GetItem, or ErrCut.
func (l *Link) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if l.cut.Load() {
		return nil, ErrCut
	}
	return l.db.GetItem(ctx, in, o...)
}

// UpdateItem is db's UpdateItem, or ErrCut.
func (l *Link) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if l.cut.Load() {
		return nil, ErrCut
	}
	return l.db.UpdateItem(ctx, in, o...)
}

// DeleteItem is db's DeleteItem, or ErrCut.
func (l *Link) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if l.cut.Load() {
		return nil, ErrCut
	}
	return l.db.DeleteItem(ctx, in, o...)
}
