package dynamolock_test

// The examples are whole programs: DynamoDB comes from the AWS SDK's
// default configuration and the lock table from DYNAMODB_TABLE, PostgreSQL
// from DATABASE_URL (stand-ins for your own). Under go test, TestMain
// points them at the test services, a fresh table and a fresh schema (see
// testenv.ExampleMain), so the examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
)

// A leader-only job: the commit to the manifest row is fenced by the
// lock's token, so a holder paused past its lease cannot overwrite a newer
// holder's commit.
func ExampleClient_Acquire() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // region, credentials, AWS_ENDPOINT_URL_DYNAMODB
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // string hash key "pk"
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE manifest (dataset text PRIMARY KEY, files text, fence bigint);
		INSERT INTO manifest VALUES ('events', 'seg-0001', NULL)`); err != nil {
		log.Fatal(err)
	}
	locks, err := dynamolock.New(ddb, table, dynamolock.WithKeyAttributes("pk", ""), dynamolock.WithLease(20*time.Second))
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
	// Output: committed: true fenced: false
}

// A nightly job on several replicas: whoever gets the lock runs it.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	for _, replica := range []string{"replica-a", "replica-b"} {
		locks, _ := dynamolock.New(ddb, table, dynamolock.WithKeyAttributes("pk", ""), dynamolock.WithOwner(replica))
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
	// Output:
	// replica-a runs the report
	// replica-b skips: replica-a runs it
}

// A write to your own DynamoDB item, fenced by the lock's token with
// dynamoconditional.Fenced: once a newer token has written the item, an
// older one is refused.
func ExampleLock_Token() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // locks and documents
	locks, _ := dynamolock.New(ddb, table, dynamolock.WithKeyAttributes("pk", ""))
	defer locks.Close()
	lock, err := locks.Acquire(ctx, "lock/doc-1")
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()
	docs, err := dynamoconditional.NewFenced(table, "pk", "fence") // the fence attribute of your items
	if err != nil {
		log.Fatal(err)
	}
	doc := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "doc-1"}}
	write := func(token int64, body string) error {
		return docs.Update(ctx, ddb, doc, token, map[string]types.AttributeValue{"body": &types.AttributeValueMemberS{Value: body}})
	}
	_, _ = ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: doc}) // the document exists
	fmt.Println("holder writes:", write(lock.Token(), "v2"))
	err = write(lock.Token()-1, "v1") // an earlier holder, paused
	fmt.Println("earlier holder fenced:", errors.Is(err, dynamoconditional.ErrFenced))
	// Output:
	// holder writes: <nil>
	// earlier holder fenced: true
}

// Writes applied only while no newer holder exists, in one transaction
// (a server with TransactWriteItems).
func ExampleLock_Transact() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // locks and documents
	put := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(table),
		Item:      map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "doc-2"}},
	}}
	locks, _ := dynamolock.New(ddb, table, dynamolock.WithKeyAttributes("pk", ""))
	defer locks.Close()
	old, err := locks.Acquire(ctx, "lock/doc-2")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holder writes:", old.Transact(ctx, ddb, put))
	_ = old.Release(ctx) // or its lease ran out while it was paused
	newer, err := locks.Acquire(ctx, "lock/doc-2")
	if err != nil {
		log.Fatal(err)
	}
	defer newer.Close()
	err = old.Transact(ctx, ddb, put)
	fmt.Println("old holder fenced:", errors.Is(err, dynamolock.ErrFenced))
	// Output:
	// holder writes: <nil>
	// old holder fenced: true
}

// The README's quickstart: one replica of several runs tonight's report;
// while another holds the lock, TryAcquire returns at once and the report
// is not run twice.
func ExampleClient_TryAcquire_quickstart() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb := dynamodb.NewFromConfig(cfg)
	// A lock table as dynamolock expects it by default: string partition key "key".
	table := os.Getenv("DYNAMODB_TABLE") + "-locks"
	if err := services.CreateTableKeyed(ctx, ddb, table, "key"); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = services.DeleteTable(ctx, ddb, table) }()
	runReport := func(ctx context.Context, token int64) error {
		fmt.Println("report runs, token", token)
		return nil
	}
	tonight := func(ctx context.Context, day string) error {
		locks, err := dynamolock.New(ddb, table) // ddb: your *dynamodb.Client
		if err != nil {
			return err
		}
		defer locks.Close()
		lock, err := locks.TryAcquire(ctx, "report-"+day)
		if errors.Is(err, dynamolock.ErrNotAcquired) {
			return nil // another replica has it
		} else if err != nil {
			return err
		}
		defer lock.Release(ctx)
		return runReport(lock.Context(), lock.Token()) // the token fences the writes it protects
	}
	fmt.Println(tonight(ctx, "2026-10-27"))
	other, _ := dynamolock.New(ddb, table, dynamolock.WithOwner("replica-b"))
	defer other.Close()
	held, err := other.TryAcquire(ctx, "report-2026-10-28")
	if err != nil {
		log.Fatal(err)
	}
	defer held.Close()
	fmt.Println(tonight(ctx, "2026-10-28")) // replica-b has it: nothing runs
	// Output:
	// report runs, token 1
	// <nil>
	// <nil>
}

// The lock's whole life in a compaction job: the work runs under the
// lock's context, the job stops if the lease is about to run out or is
// lost, and the commit is fenced by the lock's token.
func ExampleLock_Lost() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb := dynamodb.NewFromConfig(cfg)
	table := os.Getenv("DYNAMODB_TABLE") + "-compaction"
	if err := services.CreateTableKeyed(ctx, ddb, table, "key"); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = services.DeleteTable(ctx, ddb, table) }()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS manifest (dataset text PRIMARY KEY, files text, fence bigint);
		INSERT INTO manifest VALUES ('logs', 'seg-0001', NULL)`); err != nil {
		log.Fatal(err)
	}
	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	var out string
	compactFiles := func(ctx context.Context) error { out = "seg-0101"; return ctx.Err() }

	compact := func(ctx context.Context) error {
		locks, err := dynamolock.New(ddb, table, // table with a string partition key "key"
			dynamolock.WithLease(20*time.Second),    // default 20 s
			dynamolock.WithHeartbeat(5*time.Second), // default lease/4; must be <= lease/2
			dynamolock.WithOwner("compactor-7"))
		if err != nil {
			return err
		}
		defer locks.Close() // releases what it holds, waits for its goroutines

		lock, err := locks.Acquire(ctx, "compaction/logs",
			dynamolock.WithWait(time.Minute),       // else: until ctx ends
			dynamolock.WithMaxHold(30*time.Minute)) // a hung holder cannot keep it forever
		if err != nil {
			return err // *HeldError (ErrNotAcquired) after the wait
		}
		defer lock.Close()

		done := make(chan error, 1)
		go func() { done <- compactFiles(lock.Context()) }() // the work, under the lock's context
		select {
		case err := <-done:
			if err != nil {
				return err
			}
		case <-lock.Expiring(): // heartbeats are failing; the lease is about to run out
			return errors.New("lease expiring: not committing")
		case <-lock.Lost(): // lock.Err(): *LostError (taken over / expired / max hold) or ErrReleased
			return lock.Err()
		}
		// Fence every write to what the lock protects with lock.Token() (manifest: a conditional.Fenced):
		return manifest.Update(ctx, pool, "logs", lock.Token(), map[string]any{"files": out}) // ErrFenced: a newer holder wrote
	}
	fmt.Println(compact(ctx))
	var files string
	_ = pool.QueryRow(ctx, `SELECT files FROM manifest WHERE dataset = 'logs'`).Scan(&files)
	fmt.Println(files)
	// Output:
	// <nil>
	// seg-0101
}
