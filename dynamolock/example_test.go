package dynamolock_test

// The examples need a DynamoDB table, so they are compiled but not run
// (no Output comment); examples/nightlycron and examples/compaction run
// the same code against the test services.

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
)

// A leader-only job: the commit to the manifest row is fenced by the
// lock's token, so a holder paused past its lease cannot overwrite a newer
// holder's commit.
func ExampleClient_Acquire() {
	ctx := context.Background()
	var ddb *dynamodb.Client // your client
	var pool *pgxpool.Pool   // your database
	locks, err := dynamolock.New(ddb, "locks", dynamolock.WithLease(20*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	lock, err := locks.Acquire(ctx, "compaction/events", dynamolock.WithWait(time.Minute), dynamolock.WithMaxHold(time.Hour))
	if errors.Is(err, dynamolock.ErrNotAcquired) {
		return // someone else is compacting
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()

	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	// ... compact into fresh files, stopping early if lock.Context() ends ...
	err = manifest.Update(ctx, pool, "events", lock.Token(), map[string]any{"files": "seg-0101"})
	if errors.Is(err, conditional.ErrFenced) {
		log.Print("a newer leader committed; our output is discarded")
	}
}

// A nightly job on several replicas: whoever gets the lock runs it.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	var ddb *dynamodb.Client
	locks, _ := dynamolock.New(ddb, "locks")
	defer locks.Close()
	lock, err := locks.TryAcquire(ctx, "nightly-report/2026-10-27")
	var held *dynamolock.HeldError
	if errors.As(err, &held) {
		log.Printf("skipping: %s runs it", held.Owner)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()
	// ... run the report ...
}

// A write to your own DynamoDB item, fenced by the token.
func ExampleLock_Fence() {
	ctx := context.Background()
	var ddb *dynamodb.Client
	var lock *dynamolock.Lock // held
	fence, err := lock.Fence("fence")
	if err != nil {
		log.Fatal(err)
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                 aws.String("documents"),
		Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "doc-1"}},
		UpdateExpression:          aws.String("SET #body = :body"),
		ExpressionAttributeNames:  map[string]string{"#body": "body"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":body": &types.AttributeValueMemberS{Value: "v2"}},
	}
	if err := fence.ApplyUpdate(in); err != nil { // adds the condition and "fence = token"
		log.Fatal(err)
	}
	var ccf *types.ConditionalCheckFailedException
	if _, err := ddb.UpdateItem(ctx, in); errors.As(err, &ccf) {
		log.Print("fenced: a newer holder wrote this item")
	}
}

// Writes applied only while no newer holder exists, in one transaction.
func ExampleLock_Transact() {
	ctx := context.Background()
	var ddb *dynamodb.Client
	var lock *dynamolock.Lock // held
	err := lock.Transact(ctx, ddb, types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String("documents"),
		Item:      map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "doc-1"}},
	}})
	if errors.Is(err, dynamolock.ErrFenced) {
		log.Print("a newer holder exists; nothing was written")
	}
}
