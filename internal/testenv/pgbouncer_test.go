package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/testenv"
)

// bouncerWork runs, from clients goroutines, rounds of what the library
// does through a pool: a parameterised write, a parameterised read and a
// transaction, and returns how many calls failed and the distinct errors.
func bouncerWork(pool *pgxpool.Pool, clients, rounds int) (failed int, distinct []string) {
	ctx := context.Background()
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		wg   sync.WaitGroup
	)
	record := func(err error) {
		if err == nil {
			return
		}
		msg := err.Error()
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			msg = fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
		}
		mu.Lock()
		defer mu.Unlock()
		failed++
		if !seen[msg] {
			seen[msg] = true
			distinct = append(distinct, msg)
		}
	}
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				k := c*rounds + r
				_, err := pool.Exec(ctx, "INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = excluded.v", k, r)
				record(err)
				var v int
				record(pool.QueryRow(ctx, "SELECT v FROM kv WHERE k = $1", k).Scan(&v))
				record(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "UPDATE kv SET v = v + $2 WHERE k = $1", k, 1)
					return err
				}))
			}
		}()
	}
	wg.Wait()
	return failed, distinct
}

// TestPgBouncerModes runs the same work through the shared PgBouncer in
// every pgx query mode and logs what fails. Modes that keep no statement
// on the server between round trips (cache_describe, exec,
// simple_protocol) must not fail; the others are recorded, not judged:
// which of them fail on PgBouncer 1.18 is what the library must handle.
func TestPgBouncerModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, schema := testenv.PostgresSchema(t, 2)
	if _, err := direct.Exec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	dsn := testenv.PgBouncerDSNFor(t, schema)
	mustWork := map[pgx.QueryExecMode]bool{
		pgx.QueryExecModeCacheDescribe:  true,
		pgx.QueryExecModeExec:           true,
		pgx.QueryExecModeSimpleProtocol: true,
	}
	for _, mode := range testenv.QueryExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			pool := testenv.PoolMode(t, dsn, mode, 8)
			var where, app string
			// Through PgBouncer, sessions start in the test's schema.
			if err := pool.QueryRow(ctx, "SELECT current_schema(), current_setting('application_name')", pgx.QueryExecModeSimpleProtocol).Scan(&where, &app); err != nil {
				t.Fatal(err)
			}
			if where != schema || app != schema {
				t.Fatalf("current_schema %q, application_name %q; want %q for both", where, app, schema)
			}
			failed, distinct := bouncerWork(pool, 8, 25)
			t.Logf("PgBouncer, %s: %d of %d calls failed; errors: %q", mode, failed, 8*25*3, distinct)
			if mustWork[mode] && failed > 0 {
				t.Errorf("%s must work behind PgBouncer in transaction pooling", mode)
			}
		})
	}
}

// TestPgBouncerKillStart: a private PgBouncer killed with a transaction
// open ends that transaction on the server (rolled back), and once started
// again serves the rows committed before.
func TestPgBouncerKillStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, schema := testenv.PostgresSchema(t, 2)
	if _, err := direct.Exec(ctx, "CREATE TABLE kv (k int PRIMARY KEY, v int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	bouncer := testenv.PgBouncerServer(t, testenv.PostgresDSN(t))
	pool := testenv.PoolMode(t, bouncer.DSNFor(schema), pgx.QueryExecModeExec, 2)
	if _, err := pool.Exec(ctx, "INSERT INTO kv VALUES (1, 1)"); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO kv VALUES (2, 2)"); err != nil {
		t.Fatal(err)
	}
	bouncer.Kill()
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("a commit through a killed PgBouncer succeeded")
	} else {
		t.Logf("commit through the killed PgBouncer: %v", err)
	}
	testenv.Until(t, "the server ends the killed pooler's sessions", func() (bool, error) {
		var n int
		err := direct.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1", schema).Scan(&n)
		return n == 0, err
	})
	bouncer.Start()
	var n int
	testenv.Until(t, "a query through the restarted PgBouncer succeeds", func() (bool, error) {
		return pool.QueryRow(ctx, "SELECT count(*) FROM kv").Scan(&n) == nil, nil
	})
	if n != 1 {
		t.Fatalf("%d rows after the pooler's crash; want 1 (the open transaction's insert rolled back)", n)
	}
}
