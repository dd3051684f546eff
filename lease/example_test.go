package lease_test

// The examples need a database, so they are compiled but not run (no
// Output comment); the tests run the same calls against the test services.

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/lease"
)

// A leader-only job on PostgreSQL: the commit to the manifest row is
// fenced by the lock's token, so a holder paused past its lease cannot
// overwrite a newer holder's commit.
func ExampleClient_Acquire() {
	ctx := context.Background()
	var pool *pgxpool.Pool // your database
	locks, err := lease.New(pool, lease.WithLease(20*time.Second), lease.WithLockDelay(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	if err := locks.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	lock, err := locks.Acquire(ctx, "compaction/events", lease.WithWait(time.Minute), lease.WithMaxHold(time.Hour))
	if errors.Is(err, lease.ErrNotAcquired) {
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
	var pool *pgxpool.Pool
	locks, _ := lease.New(pool)
	defer locks.Close()
	lock, err := locks.TryAcquire(ctx, "nightly-report/2026-10-27")
	var held *lease.HeldError
	if errors.As(err, &held) {
		log.Printf("replica %q runs it", held.Owner)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()
	// ... run the report under lock.Context() ...
}

// The lease's own fence in your statement, etcd's IsOwner for PostgreSQL:
// the update commits only while the lock is held with this token.
func ExampleClient_FenceSQL() {
	ctx := context.Background()
	var pool *pgxpool.Pool
	locks, _ := lease.New(pool)
	defer locks.Close()
	lock, err := locks.Acquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Close()
	tag, err := pool.Exec(ctx, `UPDATE reports SET body = $3 WHERE day = '2026-10-27' AND `+locks.FenceSQL(1, 2),
		lock.Key(), lock.Token(), "...")
	if err == nil && tag.RowsAffected() == 0 {
		log.Print("lost the lock before the write committed; nothing written")
	}
}

// Code that holds either lock behind one small interface.
func Example_locker() {
	type Lock interface {
		Token() int64
		Lost() <-chan struct{}
		Context() context.Context
		Release(ctx context.Context) error
	}
	var pool *pgxpool.Pool
	locks, _ := lease.New(pool)
	defer locks.Close()
	var dl *dynamolock.Client
	// The Acquire methods differ in their option types; one adapter line each.
	fromPostgres := func(ctx context.Context, key string) (Lock, error) { return locks.Acquire(ctx, key) }
	fromDynamoDB := func(ctx context.Context, key string) (Lock, error) { return dl.Acquire(ctx, key) }
	_, _ = fromPostgres, fromDynamoDB
}
