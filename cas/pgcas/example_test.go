package pgcas_test

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
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/observe"
)

// Optimistic concurrency on your own table: the UPDATE names the version it
// read, and Exec reports ErrConflict when another writer got there first.
func ExampleExec() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE docs (id int PRIMARY KEY, body text, version bigint);
		INSERT INTO docs VALUES (1, 'draft', 1)`); err != nil {
		log.Fatal(err)
	}
	const update = `UPDATE docs SET body = $1, version = version + 1 WHERE id = 1 AND version = $2`
	fmt.Println("alice:", pgcas.Exec(ctx, pool, update, "alice's edit", 1))
	err = pgcas.Exec(ctx, pool, update, "bob's edit", 1) // bob read version 1 too
	fmt.Println("bob conflicts:", errors.Is(err, cas.ErrConflict))
	// Output:
	// alice: <nil>
	// bob conflicts: true
}

// Read-decide-write in a transaction, retried on a fresh read after a
// conflict: eight concurrent transfers keep the total intact.
func ExampleRetry() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE wallets (id text PRIMARY KEY, cents int, version bigint);
		INSERT INTO wallets VALUES ('a', 800, 1), ('b', 0, 1)`); err != nil {
		log.Fatal(err)
	}
	move := func(ctx context.Context, tx pgx.Tx) error {
		var cents, version int64
		if err := tx.QueryRow(ctx, `SELECT cents, version FROM wallets WHERE id = 'a'`).Scan(&cents, &version); err != nil {
			return err
		}
		if err := pgcas.Exec(ctx, tx, `UPDATE wallets SET cents = $1, version = version + 1 WHERE id = 'a' AND version = $2`, cents-100, version); err != nil {
			return err // ErrConflict: Retry runs move again
		}
		_, err := tx.Exec(ctx, `UPDATE wallets SET cents = cents + 100 WHERE id = 'b'`)
		return err
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pgcas.Retry(ctx, pool, move, cas.WithAttempts(100)); err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()
	var a, b int
	_ = pool.QueryRow(ctx, `SELECT (SELECT cents FROM wallets WHERE id = 'a'), (SELECT cents FROM wallets WHERE id = 'b')`).Scan(&a, &b)
	fmt.Println("a:", a, "b:", b)
	// Output:
	// a: 0 b: 800
}

// The README's quickstart: a row of your own table edited at the version
// read, retried on a fresh read if another writer got there first.
func ExampleRetry_quickstart() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS docs (id int PRIMARY KEY, body text, version bigint);
		INSERT INTO docs VALUES (7, 'draft', 1)`); err != nil {
		log.Fatal(err)
	}
	edit := func(body string) string { return body + ", edited" }
	save := func(ctx context.Context, id int) error {
		return pgcas.Retry(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			var body string
			var version int64
			err := tx.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = $1`, id).Scan(&body, &version)
			if err != nil {
				return err
			}
			// No row changed (someone wrote first): ErrConflict, and Retry runs this again.
			return pgcas.Exec(ctx, tx, `UPDATE docs SET body = $1, version = version + 1
				WHERE id = $2 AND version = $3`, edit(body), id, version)
		})
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := save(ctx, 7); err != nil {
				log.Fatal(err)
			}
		}()
	}
	wg.Wait()
	var body string
	var version int64
	_ = pool.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = 7`).Scan(&body, &version)
	fmt.Println(body, "- version", version)
	// Output:
	// draft, edited, edited, edited, edited - version 5
}

// Retry with a bound on its attempts and an observer that sees each retry
// (a Store's names its key): another writer moves the row between this
// transaction's read and its write, so the first attempt conflicts and the
// second, on a fresh read, commits.
func ExampleRetry_observer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS docs (id int PRIMARY KEY, body text, version bigint);
		INSERT INTO docs VALUES (8, 'draft', 1)`); err != nil {
		log.Fatal(err)
	}
	interfere := true
	edit := func(body string) string {
		if interfere { // another writer commits between the read and the write
			interfere = false
			if _, err := pool.Exec(ctx, `UPDATE docs SET body = 'theirs', version = version + 1 WHERE id = 8`); err != nil {
				log.Fatal(err)
			}
		}
		return body + ", mine"
	}
	logRetry := observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == cas.EventRetry {
			fmt.Println("retry after attempt", e.Attempt, "conflict:", errors.Is(e.Err, cas.ErrConflict))
		}
	})
	save := func(ctx context.Context, id int) error {
		err := pgcas.Retry(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			var body string
			var version int64
			if err := tx.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = $1`, id).Scan(&body, &version); err != nil {
				return err
			}
			return pgcas.Exec(ctx, tx, `UPDATE docs SET body = $1, version = version + 1 WHERE id = $2 AND version = $3`,
				edit(body), id, version) // 0 rows → cas.ErrConflict → retried on a fresh read
		}, cas.WithAttempts(10), cas.WithObserver(logRetry))
		return err
	}
	fmt.Println("saved:", save(ctx, 8))
	var body string
	_ = pool.QueryRow(ctx, `SELECT body FROM docs WHERE id = 8`).Scan(&body)
	fmt.Println(body)
	// Output:
	// retry after attempt 1 conflict: true
	// saved: <nil>
	// theirs, mine
}
