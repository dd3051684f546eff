package cas_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// Editors of the user's own table: read the row with its version, decide,
// write with Exec conditioned on the version. Concurrent editors never lose
// an edit, and the retries are counted and reported.
func TestRetryOwnTableLosesNoEdit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	mustExec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, version bigint NOT NULL)`)
	mustExec(t, pool, `INSERT INTO docs VALUES (1, '', 1)`)
	var ev events
	const editors, edits = 8, 10
	var wg sync.WaitGroup
	for e := 0; e < editors; e++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < edits; i++ {
				err := pgcas.Retry(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
					var body string
					var version int64
					if err := tx.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = 1`).Scan(&body, &version); err != nil {
						return err
					}
					return pgcas.Exec(ctx, tx, `UPDATE docs SET body = $1, version = version + 1 WHERE id = 1 AND version = $2`, body+"x", version)
				}, cas.WithAttempts(1000), ev.observer())
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var body string
	var version int64
	if err := pool.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = 1`).Scan(&body, &version); err != nil {
		t.Fatal(err)
	}
	commits, conflicts, retries := ev.count(cas.EventCommitted), ev.count(cas.EventConflict), ev.count(cas.EventRetry)
	if len(body) != editors*edits || version != editors*edits+1 || commits != editors*edits {
		t.Fatalf("body has %d edits, version %d, %d commits; want %d edits", len(body), version, commits, editors*edits)
	}
	if conflicts == 0 || conflicts != retries {
		t.Fatalf("%d conflicts, %d retries reported: want equal and above 0", conflicts, retries)
	}
}

// Under SERIALIZABLE the same race surfaces as SQLSTATE 40001, which Retry
// retries like a conflict.
func TestRetrySerializationFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	mustExec(t, pool, `CREATE TABLE counter (id int PRIMARY KEY, n int NOT NULL)`)
	mustExec(t, pool, `INSERT INTO counter VALUES (1, 0)`)
	var ev events
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				err := pgcas.Retry(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`); err != nil {
						return err
					}
					var n int
					if err := tx.QueryRow(ctx, `SELECT n FROM counter WHERE id = 1`).Scan(&n); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE counter SET n = $1 WHERE id = 1`, n+1)
					return err
				}, cas.WithAttempts(1000), ev.observer())
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	var n int
	if err := pool.QueryRow(ctx, `SELECT n FROM counter`).Scan(&n); err != nil || n != 80 {
		t.Fatalf("n = %d (%v), want 80", n, err)
	}
	if ev.count(cas.EventConflict) == 0 {
		t.Fatal("no serialization failure was retried: the test did not exercise 40001")
	}
}

// Two transactions that lock the same two rows in opposite orders
// deadlock; PostgreSQL aborts one (SQLSTATE 40P01), and Retry runs it
// again in a new transaction after a jittered pause, so that it does not
// meet the other before that one has taken the row it waited for: both
// commit within the default attempts, and the balances add up.
func TestRetryResolvesDeadlocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	mustExec(t, pool, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)`)
	mustExec(t, pool, `INSERT INTO accounts VALUES ('a', 100), ('b', 100)`)
	var ev events
	var arrived sync.WaitGroup
	arrived.Add(2)
	var wg sync.WaitGroup
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			first := true
			err := pgcas.Retry(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = $1`, pair[0]); err != nil {
					return err
				}
				if first { // both hold their first row before taking the second
					first = false
					arrived.Done()
					arrived.Wait()
				}
				_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + 10 WHERE id = $1`, pair[1])
				return err
			}, ev.observer())
			if err != nil {
				t.Errorf("transfer %s to %s: %v", pair[0], pair[1], err)
			}
		}()
	}
	wg.Wait()
	var a, b int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT balance FROM accounts WHERE id = 'a'), (SELECT balance FROM accounts WHERE id = 'b')`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	deadlocks := 0
	for _, err := range ev.retried() {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			deadlocks++
		}
	}
	if commits, conflicts := ev.count(cas.EventCommitted), ev.count(cas.EventConflict); a != 100 || b != 100 || commits != 2 {
		t.Fatalf("balances %d and %d after %d commits; want 100 and 100 after 2 (two opposite transfers of 10)", a, b, commits)
	} else if deadlocks == 0 || conflicts != deadlocks {
		t.Fatalf("%d deadlocks retried, %d conflicts reported: want the deadlock retried, and reported", deadlocks, conflicts)
	}
	if deadlocks > 1 {
		t.Logf("%d deadlocks: a retry deadlocked again", deadlocks)
	}
}

func TestRetryGivesUpSayingHowManyAttempts(t *testing.T) {
	t.Parallel()
	calls := 0
	err := pgcas.Retry(context.Background(), testenv.Postgres(t), func(context.Context, pgx.Tx) error {
		calls++
		return cas.ErrConflict
	}, cas.WithAttempts(4), cas.WithBackoff(time.Microsecond, time.Millisecond))
	if !errors.Is(err, cas.ErrConflict) || !strings.Contains(err.Error(), "after 4 attempts") || calls != 4 {
		t.Fatalf("err = %v after %d calls; want a conflict after 4 attempts", err, calls)
	}
	permanent := errors.New("bad request")
	calls = 0
	err = pgcas.Retry(context.Background(), testenv.Postgres(t), func(context.Context, pgx.Tx) error { calls++; return permanent })
	if !errors.Is(err, permanent) || calls != 1 {
		t.Fatalf("err = %v after %d calls; want the permanent error at once", err, calls)
	}
	for _, bad := range []error{
		pgcas.Retry(context.Background(), nil, func(context.Context, pgx.Tx) error { return nil }),
		pgcas.Retry(context.Background(), testenv.Postgres(t), nil),
		pgcas.Retry(context.Background(), testenv.Postgres(t), func(context.Context, pgx.Tx) error { return nil }, cas.WithBackoff(-1, 0)),
	} {
		if !errors.Is(bad, cas.ErrInvalid) {
			t.Errorf("bad input: %v, want ErrInvalid", bad)
		}
	}
}

// cas.Retry, with no database: conflicts (ErrConflict, or a SQLState of
// 40001/40P01) run op again, any other error ends it at once, an
// ambiguous commit is never retried, and bad input is refused before op
// runs.
func TestRetryAnyOp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fast := cas.WithBackoff(time.Microsecond, time.Microsecond)
	other := errors.New("other")
	for _, tc := range []struct {
		name     string
		errs     []error // op's answers, in order; nil after them
		attempts int
		want     error
	}{
		{"conflicts then success", []error{cas.ErrConflict, &pgconn.PgError{Code: "40001"}, &pgconn.PgError{Code: "40P01"}}, 4, nil},
		{"other error ends it", []error{cas.ErrConflict, other}, 2, other},
		{"ambiguous is not retried", []error{cas.ErrAmbiguousCommit}, 1, cas.ErrAmbiguousCommit},
		{"attempts run out", []error{cas.ErrConflict, cas.ErrConflict, cas.ErrConflict}, 3, cas.ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ev events
			n := 0
			err := cas.Retry(ctx, func(context.Context) error {
				n++
				if n <= len(tc.errs) {
					return tc.errs[n-1]
				}
				return nil
			}, fast, cas.WithAttempts(3+boolInt(tc.want == nil)), ev.observer())
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Retry = %v, want %v", err, tc.want)
			}
			if n != tc.attempts {
				t.Fatalf("op ran %d times, want %d", n, tc.attempts)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q: want one line", err)
			}
			if typ := internalType(err); typ != "" {
				t.Fatalf("error %q has %s in its chain, a type callers cannot name", err, typ)
			}
			if c := ev.count(cas.EventCommitted); c != boolInt(tc.want == nil) {
				t.Fatalf("%d commits reported, want %d", c, boolInt(tc.want == nil))
			}
		})
	}
	if err := cas.Retry(ctx, nil); !errors.Is(err, cas.ErrInvalid) {
		t.Fatalf("nil op: %v, want ErrInvalid", err)
	}
	// A Store's setter given to Retry is refused before op runs, naming it.
	ran := false
	err := cas.Retry(ctx, func(context.Context) error { ran = true; return nil }, fast, cas.WithMaxBatch(2))
	if !errors.Is(err, cas.ErrInvalid) || !strings.Contains(err.Error(), "WithMaxBatch does not apply to Retry") || ran {
		t.Fatalf("Retry with WithMaxBatch: %v (op ran: %v); want ErrInvalid naming WithMaxBatch and Retry, op not run", err, ran)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// internalType returns the first type in err's chain that belongs to an
// internal package of this module, or "".
func internalType(err error) string {
	if err == nil {
		return ""
	}
	// errfmt's wrapper only shortens a message; it carries nothing to name.
	if t := reflect.TypeOf(err); strings.Contains(pkgPath(t), "/internal/") && !strings.HasSuffix(pkgPath(t), "/internal/errfmt") {
		return t.String()
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return internalType(u.Unwrap())
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if typ := internalType(e); typ != "" {
				return typ
			}
		}
	}
	return ""
}

func pkgPath(t reflect.Type) string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}
