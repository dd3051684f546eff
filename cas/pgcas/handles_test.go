package pgcas_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// handles returns a pool on a fresh schema holding the backend's table and
// a docs table, and a *pgx.Conn on that schema, closed when the test ends.
func handles(t *testing.T) (*pgxpool.Pool, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 0)
	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE docs (id int PRIMARY KEY, n int NOT NULL, version bigint NOT NULL);
		INSERT INTO docs VALUES (1, 0, 1)`); err != nil {
		t.Fatal(err)
	}
	return pool, testenv.PostgresConn(t, schema)
}

func storeOn(t *testing.T, db pgcas.DB) *cas.Store[int] {
	t.Helper()
	b, err := pgcas.NewBackend(db)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](b, cas.JSON[int]{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// updateAll runs workers×rounds concurrent increments over keys through s
// and returns how many failed.
func updateAll(s *cas.Store[int], keys []string, workers, rounds int) (failed int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				if _, err := s.Update(context.Background(), keys[(w+r)%len(keys)], func(v int) (int, error) { return v + 1, nil }); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return failed
}

func sum(t *testing.T, s *cas.Store[int], keys []string) (total int) {
	t.Helper()
	for _, k := range keys {
		v, err := s.Get(context.Background(), k)
		if err != nil {
			t.Fatalf("Get(%q): %v", k, err)
		}
		total += v.Value
	}
	return total
}

// A Backend on a *pgx.Conn queues a Store's concurrent operations for the
// connection: 8 goroutines × 10 increments over 3 keys all apply.
func TestBackendOnAConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, conn := handles(t)
	s := storeOn(t, conn)
	keys := []string{"a", "b", "c"}
	for _, k := range keys {
		if err := s.Create(ctx, k, 0); err != nil {
			t.Fatal(err)
		}
	}
	if failed := updateAll(s, keys, 8, 10); failed != 0 {
		t.Fatalf("%d of 80 updates on a conn failed", failed)
	}
	if n := sum(t, storeOn(t, pool), keys); n != 80 {
		t.Fatalf("sum read through the pool %d, want 80", n)
	}
}

// A Backend on a pgx.Tx applies a Store's operations in the caller's
// transaction: invisible to others until it commits, gone after a
// rollback; concurrent Updates queue for the transaction.
func TestBackendInACallersTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := handles(t)
	byPool := storeOn(t, pool)
	keys := []string{"a", "b"}
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s := storeOn(t, tx)
		for _, k := range keys {
			if err := s.Create(ctx, k, 0); err != nil {
				t.Fatal(err)
			}
		}
		if failed := updateAll(s, keys, 4, 5); failed != 0 {
			t.Fatalf("%d of 20 updates in a tx failed", failed)
		}
		if n := sum(t, s, keys); n != 20 {
			t.Fatalf("sum read in the tx %d, want 20", n)
		}
		if _, err := byPool.Get(ctx, "a"); !errors.Is(err, cas.ErrNotFound) {
			t.Fatalf("Get through the pool while the tx is open: %v; want ErrNotFound", err)
		}
		if !commit {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if _, err := byPool.Get(ctx, k); !errors.Is(err, cas.ErrNotFound) {
					t.Fatalf("Get(%q) after a rollback: %v; want ErrNotFound", k, err)
				}
			}
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := sum(t, byPool, keys); n != 20 {
			t.Fatalf("sum after the commit %d, want 20", n)
		}
	}
}

// Retry on a *pgx.Conn commits each attempt; in a pgx.Tx its attempts are
// savepoints (a conflict retries), and a rollback of the caller's
// transaction leaves nothing. Exec reports a lost compare-and-set as
// ErrConflict on each handle.
func TestRetryAndExecOnEachHandle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, conn := handles(t)
	const update = `UPDATE docs SET n = n + 1, version = version + 1 WHERE id = 1 AND version = $1`
	bump := func(stale bool) func(ctx context.Context, tx pgx.Tx) error {
		first := stale
		return func(ctx context.Context, tx pgx.Tx) error {
			var v int64
			if err := tx.QueryRow(ctx, `SELECT version FROM docs WHERE id = 1`).Scan(&v); err != nil {
				return err
			}
			if first { // a version read before another writer moved it on
				first = false
				v--
			}
			return pgcas.Exec(ctx, tx, update, v)
		}
	}
	read := func() (n int, v int64) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT n, version FROM docs WHERE id = 1`).Scan(&n, &v); err != nil {
			t.Fatal(err)
		}
		return n, v
	}
	if err := pgcas.Retry(ctx, conn, bump(true)); err != nil {
		t.Fatalf("Retry on a conn: %v", err)
	}
	if err := pgcas.Exec(ctx, conn, update, int64(1)); !errors.Is(err, cas.ErrConflict) {
		t.Fatalf("Exec of a stale version on a conn: %v; want ErrConflict", err)
	}
	if n, v := read(); n != 1 || v != 2 {
		t.Fatalf("after Retry on a conn: n %d version %d, want 1 and 2", n, v)
	}
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := pgcas.Retry(ctx, tx, bump(true)); err != nil {
			t.Fatalf("Retry in a tx: %v", err)
		}
		if err := pgcas.Exec(ctx, tx, update, int64(2)); !errors.Is(err, cas.ErrConflict) {
			t.Fatalf("Exec of a stale version in a tx: %v; want ErrConflict", err)
		}
		if n, v := read(); n != 1 || v != 2 {
			t.Fatalf("through the pool while the tx is open: n %d version %d, want 1 and 2", n, v)
		}
		end := tx.Rollback
		if commit {
			end = tx.Commit
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
		want := map[bool]int{false: 1, true: 2}[commit]
		if n, _ := read(); n != want {
			t.Fatalf("commit=%v: n %d, want %d", commit, n, want)
		}
	}
}
