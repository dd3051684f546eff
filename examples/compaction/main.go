// Command compaction is the background article's third case: a
// leader-only compaction job that writes its output under fresh names and
// commits it by updating a manifest row in PostgreSQL. The leader holds a
// dynamolock lock; the commit is fenced by the lock's token through
// conditional.Fenced, so the manifest only accepts tokens at least as high
// as the highest it has seen.
//
// Worker A takes the lock and starts compacting, then freezes (a long GC
// pause: its heartbeats stop too) past its lease. Worker B, waiting, sees
// A's record version unchanged for a full lease and takes over with a
// higher token, compacts and commits. A wakes up, never having seen its
// lock go, and commits: the manifest refuses it with ErrFenced, and B's
// output stays. The same commit without the fence would have overwritten
// B's manifest with A's stale file list.
//
//	go run ./examples/compaction [-endpoint http://127.0.0.1:18000] [-dsn postgres://…]
//
// The endpoint and DSN default to $NOLOCK_TEST_DYNAMODB and
// $NOLOCK_TEST_POSTGRES (see scripts/services).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
)

const lease = time.Second

func main() {
	endpoint := flag.String("endpoint", os.Getenv("NOLOCK_TEST_DYNAMODB"), "DynamoDB endpoint URL")
	dsn := flag.String("dsn", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	flag.Parse()
	if err := run(context.Background(), *endpoint, *dsn); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, endpoint, dsn string) error {
	if endpoint == "" || dsn == "" {
		return errors.New("no -endpoint/-dsn and no NOLOCK_TEST_DYNAMODB/NOLOCK_TEST_POSTGRES: run scripts/services up, then eval \"$(scripts/services env)\"")
	}
	db := services.DynamoDBClient(endpoint, nil)
	suffix := time.Now().UnixNano()
	table := fmt.Sprintf("nolock_compaction_%d", suffix)
	if err := services.CreateTableKeyed(ctx, db, table, "key"); err != nil { // dynamolock's default key name
		return err
	}
	defer services.DeleteTable(context.Background(), db, table)

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	// The manifest: one row per dataset, with the highest token that
	// committed to it.
	manifest := fmt.Sprintf("nolock_manifest_%d", suffix)
	ident := pgx.Identifier{manifest}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ident+` (dataset text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0);
INSERT INTO `+ident+` (dataset, files) VALUES ('events', 'seg-0001..seg-0100')`); err != nil {
		return err
	}
	defer pool.Exec(context.Background(), "DROP TABLE "+ident)
	fenced, err := conditional.NewFenced(manifest, "dataset", "fence")
	if err != nil {
		return err
	}

	// Worker A's process will freeze: frozen cuts its DynamoDB traffic, as
	// a paused process sends nothing (its heartbeat goroutine is paused too).
	var frozen atomic.Bool
	a, err := dynamolock.New(freezable{db, &frozen}, table, dynamolock.WithLease(lease), dynamolock.WithOwner("worker-a"))
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := dynamolock.New(db, table, dynamolock.WithLease(lease), dynamolock.WithOwner("worker-b"))
	if err != nil {
		return err
	}
	defer b.Close()

	la, err := a.Acquire(ctx, "compaction/events")
	if err != nil {
		return err
	}
	fmt.Printf("worker-a: leader with token %d; compacting seg-0001..seg-0100 into a-0001\n", la.Token())

	bDone := make(chan error, 1)
	go func() { bDone <- workerB(ctx, b, fenced, pool) }()

	frozen.Store(true)
	fmt.Printf("worker-a: frozen (GC pause) for %v, past its %v lease\n", 3*lease, lease)
	time.Sleep(3 * lease)
	if err := <-bDone; err != nil {
		return err
	}
	frozen.Store(false)

	// A wakes up mid-job and commits without looking at its lock: the
	// pause can fall between any check and the write, so the manifest
	// must decide.
	err = fenced.Update(ctx, pool, "events", la.Token(), map[string]any{"files": "a-0001"})
	switch {
	case errors.Is(err, conditional.ErrFenced):
		fmt.Printf("worker-a: woke up; commit with token %d refused: %v\n", la.Token(), err)
	case err != nil:
		return err
	default:
		return errors.New("worker-a's stale commit was accepted: fencing failed")
	}
	<-la.Lost()
	fmt.Printf("worker-a: its lock reports: %v\n", la.Err())

	var files string
	var fence int64
	if err := pool.QueryRow(ctx, "SELECT files, fence FROM "+ident+" WHERE dataset = 'events'").Scan(&files, &fence); err != nil {
		return err
	}
	fmt.Printf("manifest: events -> %s (fence %d)\n", files, fence)
	return nil
}

// workerB waits for the lock, compacts and commits with its token.
func workerB(ctx context.Context, b *dynamolock.Client, fenced *conditional.Fenced, pool *pgxpool.Pool) error {
	start := time.Now()
	lb, err := b.Acquire(ctx, "compaction/events")
	if err != nil {
		return err
	}
	defer lb.Release(ctx)
	fmt.Printf("worker-b: took over after %v with token %d; compacting into b-0001\n", time.Since(start).Round(10*time.Millisecond), lb.Token())
	if err := fenced.Update(ctx, pool, "events", lb.Token(), map[string]any{"files": "b-0001"}); err != nil {
		return err
	}
	fmt.Printf("worker-b: committed b-0001 with token %d\n", lb.Token())
	return nil
}

// freezable is a worker's connection to DynamoDB, silent while frozen.
type freezable struct {
	*dynamodb.Client
	frozen *atomic.Bool
}

var errFrozen = errors.New("process frozen")

func (f freezable) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if f.frozen.Load() {
		return nil, errFrozen
	}
	return f.Client.GetItem(ctx, in, o...)
}

func (f freezable) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if f.frozen.Load() {
		return nil, errFrozen
	}
	return f.Client.UpdateItem(ctx, in, o...)
}

func (f freezable) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if f.frozen.Load() {
		return nil, errFrozen
	}
	return f.Client.DeleteItem(ctx, in, o...)
}
