package dynamolock_test

// The examples are whole programs: DynamoDB comes from exampleDynamoDB and
// exampleTable, PostgreSQL from DATABASE_URL (stand-ins for your own). They
// have no Output comment, so go test only compiles them; TestExamples runs
// each one against the test services and checks what it prints.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// A leader-only job: the commit to the manifest row is fenced by the
// lock's token, so a holder paused past its lease cannot overwrite a newer
// holder's commit.
func ExampleClient_Acquire() {
	ctx := context.Background()
	ddb, table := exampleDynamoDB(), exampleTable("key") // your client and lock table
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locks, err := dynamolock.New(ddb, table, dynamolock.WithLease(20*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	lock, err := locks.Acquire(ctx, "compaction/events", dynamolock.WithWait(time.Minute), dynamolock.WithMaxHold(time.Hour))
	if err != nil {
		log.Fatal(err) // ErrNotAcquired: someone else is compacting
	}
	defer lock.Close()
	// ... compact into fresh files, stopping early if lock.Context() ends ...
	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	err = manifest.Update(ctx, pool, "events", lock.Token(), map[string]any{"files": "seg-0101"})
	fmt.Println("committed:", err == nil, "fenced:", errors.Is(err, conditional.ErrFenced))
}

// A nightly job on several replicas: whoever gets the lock runs it.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	ddb, table := exampleDynamoDB(), exampleTable("key")
	for _, replica := range []string{"replica-a", "replica-b"} {
		locks, _ := dynamolock.New(ddb, table, dynamolock.WithOwner(replica))
		defer locks.Close()
		lock, err := locks.TryAcquire(ctx, "nightly-report/2026-10-27")
		var held *dynamolock.HeldError
		if errors.As(err, &held) {
			fmt.Printf("%s skips: %s runs it\n", replica, held.Owner)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		defer lock.Close()
		fmt.Println(replica, "runs the report")
	}
}

// A write to your own DynamoDB item, fenced by the token: once a newer
// token has written the item, an older one is refused.
func ExampleLock_Fence() {
	ctx := context.Background()
	ddb, table, docs := exampleDynamoDB(), exampleTable("key"), exampleTable("id")
	locks, _ := dynamolock.New(ddb, table)
	defer locks.Close()
	lock, err := locks.Acquire(ctx, "doc-1")
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()
	write := func(f dynamolock.Fence, body string) error {
		in := &dynamodb.UpdateItemInput{
			TableName:                 aws.String(docs),
			Key:                       map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "doc-1"}},
			UpdateExpression:          aws.String("SET #body = :body"),
			ExpressionAttributeNames:  map[string]string{"#body": "body"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":body": &types.AttributeValueMemberS{Value: body}},
		}
		if err := f.ApplyUpdate(in); err != nil { // adds the condition and "fence = token"
			return err
		}
		_, err := ddb.UpdateItem(ctx, in)
		return err
	}
	fence, _ := lock.Fence("fence")
	fmt.Println("holder writes:", write(fence, "v2"))
	stale, _ := dynamolock.NewFence("fence", lock.Token()-1) // an earlier holder, paused
	var ccf *types.ConditionalCheckFailedException
	fmt.Println("earlier holder fenced:", errors.As(write(stale, "v1"), &ccf))
}

// Writes applied only while no newer holder exists, in one transaction.
func ExampleLock_Transact() {
	ctx := context.Background()
	ddb, table, docs := exampleDynamoDB(), exampleTable("key"), exampleTable("id") // a server with transactions
	put := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(docs),
		Item:      map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "doc-1"}},
	}}
	locks, _ := dynamolock.New(ddb, table)
	defer locks.Close()
	old, err := locks.Acquire(ctx, "doc-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder writes:", old.Transact(ctx, ddb, put))
	_ = old.Release(ctx) // or its lease ran out while it was paused
	newer, err := locks.Acquire(ctx, "doc-1")
	if err != nil {
		log.Fatal(err)
	}
	defer newer.Close()
	err = old.Transact(ctx, ddb, put)
	fmt.Println("old holder fenced:", errors.Is(err, dynamolock.ErrFenced))
}

// TestExamples runs each Example against the test services: PostgreSQL in
// a fresh schema (DATABASE_URL), DynamoDB in fresh tables, on the server
// with transactions where the example needs them.
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name string
		run  func()
		tx   bool
		want string
	}{
		{"Client_Acquire", ExampleClient_Acquire, false, "committed: true fenced: false\n"},
		{"Client_TryAcquire", ExampleClient_TryAcquire, false, "replica-a runs the report\nreplica-b skips: replica-a runs it\n"},
		{"Lock_Fence", ExampleLock_Fence, false, "holder writes: <nil>\nearlier holder fenced: true\n"},
		{"Lock_Transact", ExampleLock_Transact, true, "holder writes: <nil>\nold holder fenced: true\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			pool, schema := testenv.PostgresSchema(t, 1)
			if _, err := pool.Exec(context.Background(), `CREATE TABLE manifest (dataset text PRIMARY KEY, files text, fence bigint);
				INSERT INTO manifest VALUES ('events', 'seg-0001', NULL)`); err != nil {
				t.Fatal(err)
			}
			t.Setenv("DATABASE_URL", testenv.PostgresDSNFor(t, schema))
			ddb := testenv.DynamoDB(t)
			if ex.tx {
				ddb = testenv.DynamoDBTx(t)
			}
			exampleDynamoDB = func() *dynamodb.Client { return ddb }
			exampleTable = func(hashKey string) string { return keyedTable(t, ddb, hashKey) }
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}

// exampleDynamoDB and exampleTable return the examples' client and a fresh
// table with the given string hash key; TestExamples sets them.
var (
	exampleDynamoDB func() *dynamodb.Client
	exampleTable    func(hashKey string) string
)

// keyedTable creates a fresh table whose string hash key is hashKey and
// deletes it when the test ends.
func keyedTable(t *testing.T, ddb *dynamodb.Client, hashKey string) string {
	t.Helper()
	name := testenv.Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := services.CreateTableKeyed(ctx, ddb, name, hashKey); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := services.DeleteTable(ctx, ddb, name); err != nil {
			t.Error(err)
		}
	})
	return name
}
