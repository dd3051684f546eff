package lease_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
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
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE manifest (dataset text PRIMARY KEY, files text, fence bigint);
		INSERT INTO manifest VALUES ('events', 'seg-0001', NULL)`); err != nil {
		log.Fatal(err)
	}
	locks, err := lease.New(pool, lease.WithLease(20*time.Second), lease.WithLockDelay(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()
	if err := locks.CreateSchema(ctx); err != nil { // or copy locks.Schema() into your migrations
		log.Fatal(err)
	}
	lock, err := locks.Acquire(ctx, "compaction/events", lease.WithWait(time.Minute), lease.WithMaxHold(time.Hour))
	if err != nil {
		log.Fatal(err) // ErrNotAcquired: someone else is compacting
	}
	defer lock.Close()
	// ... compact into fresh files, stopping early if lock.Context() ends;
	// then commit through a fence, with the lock's token:
	manifest, _ := conditional.NewFenced("manifest", "dataset", "fence")
	err = manifest.Update(ctx, pool, "events", lock.Token(), map[string]any{"files": "seg-0101"})
	fmt.Println("committed:", err == nil, "fenced:", errors.Is(err, conditional.ErrFenced))
	// Output: committed: true fenced: false
}

// A nightly job on several replicas: whoever gets the lock runs it.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	for _, replica := range []string{"replica-a", "replica-b"} {
		locks, _ := lease.New(pool, lease.WithOwner(replica))
		defer locks.Close()
		if err := locks.CreateSchema(ctx); err != nil {
			log.Fatal(err)
		}
		lock, err := locks.TryAcquire(ctx, "nightly-report/2026-10-27")
		var held *lease.HeldError
		if errors.As(err, &held) {
			fmt.Printf("%s skips: %s runs it\n", replica, held.Owner)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		defer lock.Close()
		fmt.Println(replica, "runs the report") // under lock.Context()
	}
	// Output:
	// replica-a runs the report
	// replica-b skips: replica-a runs it
}

// The lease's own fence in your statement, etcd's IsOwner for PostgreSQL:
// the update commits only while the lock is held with this token.
func ExampleClient_FenceSQL() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE reports (day date PRIMARY KEY, body text);
		INSERT INTO reports VALUES ('2026-10-27', '')`); err != nil {
		log.Fatal(err)
	}
	locks, _ := lease.New(pool)
	defer locks.Close()
	if err := locks.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	lock, err := locks.Acquire(ctx, "report")
	if err != nil {
		log.Fatal(err)
	}
	write := `UPDATE reports SET body = $3 WHERE day = '2026-10-27' AND ` + locks.FenceSQL(1, 2)
	tag, err := pool.Exec(ctx, write, lock.Key(), lock.Token(), "v1")
	fmt.Println("holder writes:", tag.RowsAffected(), err)
	_ = lock.Close() // released, or its lease ran out while it was paused
	tag, err = pool.Exec(ctx, write, lock.Key(), lock.Token(), "v0")
	fmt.Println("after release:", tag.RowsAffected(), err) // nothing written
	// Output:
	// holder writes: 1 <nil>
	// after release: 0 <nil>
}

// Code that holds either lock behind one small interface.
func Example_locker() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	pgLocks, _ := lease.New(pool)
	defer pgLocks.Close()
	if err := pgLocks.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	var ddbLocks *dynamolock.Client // dynamolock.New(...), on DynamoDB

	type Lock interface {
		Token() int64
		Lost() <-chan struct{}
		Context() context.Context
		Release(ctx context.Context) error
	}
	type Acquire func(ctx context.Context, key string) (Lock, error)

	fromPostgres := func(ctx context.Context, key string) (Lock, error) { return pgLocks.Acquire(ctx, key) }
	fromDynamoDB := func(ctx context.Context, key string) (Lock, error) { return ddbLocks.Acquire(ctx, key) }

	acquire := map[string]Acquire{"postgres": fromPostgres, "dynamodb": fromDynamoDB}["postgres"]
	lock, err := acquire(ctx, "jobs/reindex")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("token > 0:", lock.Token() > 0)
	fmt.Println("released:", lock.Release(ctx))
	// Output:
	// token > 0: true
	// released: <nil>
}
