package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// A handler that sends 103 Early Hints and then fails with 500 failed:
// nothing commits, nothing is stored, the client gets the 500.
func TestMiddlewareInformationalStatusIsNotFinal(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mw, err := idempotency.Middleware(b.store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		if err := debit(r.Context(), tx, "alice", 500); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		http.Error(w, "ledger unavailable", http.StatusInternalServerError)
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader("x"))
	req.Header.Set(idempotency.HeaderKey, "k1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	_, gerr := b.store.Get(context.Background(), "", "k1")
	if resp.StatusCode != http.StatusInternalServerError || !errors.Is(gerr, idempotency.ErrNotFound) || b.balance("alice") != initial {
		t.Fatalf("103 then 500: client got %d, record: %v, balance %d; want 500, no record, %d", resp.StatusCode, gerr, b.balance("alice"), initial)
	}
}

// With WithAttempts(1) (never run fn twice) concurrent deliveries of a key
// whose record just expired still replay: finding the record gone again
// is not a run of fn and does not spend the attempt.
func TestVanishedRecordIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	one, err := idempotency.New(b.pool, idempotency.WithAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil }
	if _, err := one.Do(ctx, "s", "k", nil, noop); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int64
	for round := 0; round < 20; round++ {
		mustExec(t, b.pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s'`)
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := one.Do(ctx, "s", "k", nil, noop); err != nil {
					t.Log(err)
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
	}
	if failed.Load() > 0 {
		t.Fatalf("%d of 120 deliveries failed instead of running or replaying", failed.Load())
	}
}

// A savepoint fn kept is refused once fn has returned, like fn's tx.
func TestSavepointIsClosedAfterFn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	var sp pgx.Tx
	_, err := b.store.Do(ctx, "s", "k", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		var err error
		if sp, err = tx.Begin(ctx); err != nil {
			return nil, err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO ledger VALUES ('inside', 'alice', 1)`); err != nil {
			return nil, err
		}
		return []byte("ok"), sp.Commit(ctx) // releasing a savepoint is fn's to do
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sp.Exec(ctx, `INSERT INTO ledger VALUES ('stray', 'alice', 1)`)
	var stray, inside int
	if qerr := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE payment = 'stray'), count(*) FILTER (WHERE payment = 'inside') FROM ledger`).Scan(&stray, &inside); qerr != nil {
		t.Fatal(qerr)
	}
	if !errors.Is(err, pgx.ErrTxClosed) || stray != 0 || inside != 1 {
		t.Fatalf("savepoint used after fn: %v, %d stray rows, %d inside; want ErrTxClosed, 0 and 1", err, stray, inside)
	}
}

// A statement missing an argument is refused before it runs: its $1
// would otherwise bind one of Exec's own parameters, and a debit matching
// no row would be stored as declined.
func TestExecRefusesMissingArguments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	_, err := b.store.Exec(ctx, "alice", "pay-1", nil, debitSQL, "alice")
	if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "2 parameters and 1 args") {
		t.Fatalf("Exec with one of two arguments: %v, want ErrInvalid naming the counts", err)
	}
	if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record after a refused Exec: %v, want ErrNotFound", err)
	}
	if res, err := b.store.Exec(ctx, "alice", "pay-1", nil, debitSQL, "alice", int64(5)); err != nil || res.Terminal {
		t.Fatalf("Exec with both: %+v, %v", res, err)
	}
}

// middlewarePost runs h behind the middleware on store and posts body
// under key.
func middlewarePost(t *testing.T, store *idempotency.Store, h http.Handler, key, body string, opts ...idempotency.MiddlewareOption) (int, string, string) {
	t.Helper()
	mw, err := idempotency.Middleware(store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
	req.Header.Set(idempotency.HeaderKey, key)
	rec := httptest.NewRecorder()
	mw(h).ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), rec.Header().Get(idempotency.HeaderReplayed)
}

// WithMaxBody(math.MaxInt64), "no limit", must not read every body as
// empty (the limit + 1 overflowed): the handler sees the body, and
// another body under the same key is a mismatch.
func TestMiddlewareMaxBodyMaxInt64(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write([]byte("handler saw " + string(body)))
	})
	if code, body, _ := middlewarePost(t, b.store, echo, "k1", "pay alice 500", idempotency.WithMaxBody(math.MaxInt64)); code != 200 || body != "handler saw pay alice 500" {
		t.Fatalf("first: %d %q", code, body)
	}
	if code, _, _ := middlewarePost(t, b.store, echo, "k1", "pay bob 999", idempotency.WithMaxBody(math.MaxInt64)); code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d, want 422", code)
	}
}

// A response that could not be replayed (a header value with a control
// byte) is not committed: the debit rolls back, nothing is stored.
func TestMiddlewareUnstorableResponseRollsBack(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		if err := debit(r.Context(), tx, "alice", 500); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.Header().Set("X-Note", "paid for \x01user note")
		w.WriteHeader(http.StatusCreated)
	})
	code, body, _ := middlewarePost(t, b.store, h, "k", "x")
	_, gerr := b.store.Get(context.Background(), "", "k")
	if code != 500 || !strings.Contains(body, "cannot be stored") || !strings.Contains(body, `"type":"urn:nolock:idempotency:response-unstorable"`) || !errors.Is(gerr, idempotency.ErrNotFound) || b.balance("alice") != initial {
		t.Fatalf("unstorable response: %d %q, record %v, balance %d; want 500 naming it, nothing stored, %d", code, body, gerr, b.balance("alice"), initial)
	}
}

// A 4xx answered after a failed statement of the transaction (a unique
// violation read as "already exists") reaches the client as the
// handler's 4xx, unstored, not as a 500.
func TestMiddleware4xxAfterFailedStatement(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	mustExec(t, b.pool, `INSERT INTO ledger VALUES ('dup', 'alice', 1)`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO ledger VALUES ('dup', 'alice', 1)`); err != nil {
			http.Error(w, "payment already exists", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	for i := 0; i < 2; i++ {
		if code, body, replayed := middlewarePost(t, b.store, h, "k1", "x"); code != http.StatusConflict || !strings.Contains(body, "already exists") || replayed != "" {
			t.Fatalf("attempt %d: %d %q replayed=%q; want the handler's own 409", i, code, body, replayed)
		}
	}
}

// simpleProtocolPool is a pool on schema that prepares no statement, as
// one set up for PgBouncer's transaction mode; closed when t ends.
func simpleProtocolPool(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresDSNFor(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Through a simple-protocol pool (pgbouncer's usual setting) a statement
// whose parameter type cannot be inferred alone still runs: Exec's
// parameter check steps aside when the server cannot describe it.
func TestExecSimpleProtocolStatement(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool := simpleProtocolPool(t, b.schema)
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Exec(context.Background(), "s", "k", nil, `SELECT $1 IS NULL AS n`, "x")
	if err != nil || string(res.Body) != `[{"n":false}]` {
		t.Fatalf("Exec through simple protocol: %+v, %v", res, err)
	}
}

// A DEALLOCATE ALL (as a pooler's reset runs) leaves pgx believing the
// statements it prepared still exist. Exec goes on: nothing is lost or
// applied twice.
func TestExecAfterDeallocateAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	pool := testenv.Pool(t, testenv.PostgresDSNFor(t, b.schema), 1) // one connection: the one reset
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	pay := func(key string) (idempotency.Result, error) {
		return store.Exec(ctx, "alice", key, nil, debitSQL, "alice", int64(10))
	}
	if _, err := pay("pay-1"); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `DEALLOCATE ALL`)
	if res, err := pay("pay-2"); err != nil || res.Replayed {
		t.Fatalf("a new key after DEALLOCATE ALL: %+v, %v; want a fresh run", res, err)
	}
	mustExec(t, pool, `DEALLOCATE ALL`)
	if res, err := pay("pay-1"); err != nil || !res.Replayed {
		t.Fatalf("a used key after DEALLOCATE ALL: %+v, %v; want a replay", res, err)
	}
	mustExec(t, pool, `DEALLOCATE ALL`)
	store.PinPlan("readfirst")
	if res, err := pay("pay-3"); err != nil || res.Replayed {
		t.Fatalf("a new key after DEALLOCATE ALL, reading first: %+v, %v; want a fresh run", res, err)
	}
	if got := b.balance("alice"); got != initial-30 {
		t.Fatalf("balance %d, want %d", got, initial-30)
	}
}

// Where transactions are Serializable by default, concurrent first runs of
// neighbouring keys do not fail each other (40001).
func TestExecSerializableDefaultDistinctKeys(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool := testenv.Pool(t, testenv.PostgresDSNFor(t, b.schema)+"&default_transaction_isolation=serializable", 16)
	store, err := idempotency.New(pool, idempotency.WithAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				if _, err := store.Exec(context.Background(), "s", fmt.Sprintf("k-%d-%d", g, i), nil, `SELECT $1::int AS v`, i); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 320 Execs of distinct keys failed; first: %v", n, first.Load())
	}
}

// A Store remembers the first MaxDescribed statement texts it checks, and
// no more (SQL built afresh for each call must not grow it without end);
// texts past that are described again on each call, and still checked. The
// test lowers the bound to reach it in a few calls.
func TestExecRemembersBoundedStatementTexts(t *testing.T) {
	t.Parallel()
	if idempotency.MaxDescribed != 4096 {
		t.Fatalf("a Store remembers %d statement texts, want 4096", idempotency.MaxDescribed)
	}
	ctx := context.Background()
	b := newBed(t)
	const bound = 8
	b.store.RememberAtMost(bound)
	var remembered int
	var err error
	for i := 0; i < bound+4; i++ {
		if remembered, err = b.store.CheckStatement(ctx, fmt.Sprintf(`SELECT $1::int + %d AS v`, i), 1); err != nil {
			t.Fatal(err)
		}
	}
	if remembered != bound {
		t.Fatalf("%d statement texts remembered, want %d", remembered, bound)
	}
	if _, err := b.store.CheckStatement(ctx, fmt.Sprintf(`SELECT $1::int + %d AS v`, bound+3), 2); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("a text past the bound with 2 args for 1 parameter: %v, want ErrInvalid", err)
	}
}

// A statement failing with SQLSTATE 0A000 of its own (a function raising
// feature_not_supported) is the statement's error: it runs once and its
// error is returned. Only a prepared statement the server revalidated and
// found changed (the same code) is prepared again.
func TestExecStatementFeatureNotSupportedRunsOnce(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		mustExec(t, b.pool, `CREATE SEQUENCE effects`)
		mustExec(t, b.pool, `CREATE FUNCTION unsupported() RETURNS bigint LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'not supported here' USING ERRCODE = 'feature_not_supported'; END $$`)
		_, err := b.store.Exec(ctx, "alice", "pay-1", nil,
			`UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND nextval('effects') > 0 AND unsupported() > 0 RETURNING balance`, "alice", int64(5))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "0A000" {
			t.Fatalf("Exec: %v, want the statement's 0A000", err)
		}
		var runs int64
		if err := b.pool.QueryRow(ctx, `SELECT last_value FROM effects`).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs != 1 {
			t.Fatalf("the effect ran %d times, want once", runs)
		}
	})
}

// After a change to the record's column types, the statements pgx
// prepared no longer fit ("cached plan must not change result type"):
// Exec goes on.
func TestExecAfterColumnTypeChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	if _, err := b.execPay(ctx, "pay-1", 10); err != nil {
		t.Fatal(err)
	}
	mustExec(t, b.pool, `ALTER TABLE nolock_idempotency ALTER COLUMN created_at TYPE timestamp`)
	for i, k := range []string{"pay-2", "pay-1"} {
		if res, err := b.execPay(ctx, k, 10); err != nil || res.Replayed != (i == 1) {
			t.Fatalf("%s after the column's type changed: %+v, %v", k, res, err)
		}
	}
}

// An argument pgx cannot encode never reaches the server: not
// ErrAmbiguousCommit, which a caller would retry for ever.
func TestExecUnencodableArgIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		b := newBed(t)
		pin(b.store)
		_, err := b.store.Exec(context.Background(), "alice", "pay-1", nil, `SELECT $1::int AS v`, int64(1)<<40)
		if err == nil || errors.Is(err, idempotency.ErrAmbiguousCommit) || !strings.Contains(err.Error(), "encode") {
			t.Fatalf("Exec with an argument that does not encode: %v, want the encoding error, not ErrAmbiguousCommit", err)
		}
	})
}

// acquireCounter counts Acquire calls: through a simple-protocol pool,
// Exec acquires a connection only to describe a statement.
type acquireCounter struct {
	*pgxpool.Pool
	n atomic.Int64
}

func (d *acquireCounter) Acquire(ctx context.Context) (*pgxpool.Conn, error) {
	d.n.Add(1)
	return d.Pool.Acquire(ctx)
}

// A statement the server cannot describe alone (42P18) is described once,
// not on every call.
func TestExecUndescribableStatementDescribedOnce(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool := simpleProtocolPool(t, b.schema)
	db := &acquireCounter{Pool: pool}
	store, err := idempotency.New(db)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		if _, err := store.Exec(context.Background(), "s", fmt.Sprint("k", i), nil, `SELECT $1 IS NULL AS n`, "x"); err != nil {
			t.Fatal(err)
		}
	}
	// Each call acquires a connection to run the statement; describing
	// it acquires one more.
	if n := db.n.Load() - 20; n != 1 {
		t.Fatalf("the statement was described %d times in 20 calls, want once", n)
	}
}

// A statement whose first description meets a dead pooled connection is
// not run unchecked (its missing $2 would bind one of Exec's own
// parameters, and the debit run and be stored): the call fails having run
// nothing, and the next call describes it and refuses the missing argument.
func TestExecDescribeOnDeadConnectionFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	one := testenv.Pool(t, testenv.PostgresDSNFor(t, b.schema), 1)
	store, err := idempotency.New(one)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := one.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, b.pool, `SELECT pg_terminate_backend($1)`, pid)
	testenv.Until(t, "the pooled backend is gone", func() (bool, error) {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
		return n == 0, err
	})
	const sql = `UPDATE wallets SET balance = balance - 1 WHERE account = $1 AND $2::text IS NOT NULL RETURNING balance`
	if _, err := store.Exec(ctx, "alice", "pay-1", nil, sql, "alice"); err == nil || errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Exec on a dead connection: %v; want the connection's failure, not ambiguous", err)
	}
	if got := b.balance("alice"); got != initial {
		t.Fatalf("alice %d after the failed call; want %d (the statement ran unchecked)", got, initial)
	}
	if _, err := store.Exec(ctx, "alice", "pay-1", nil, sql, "alice"); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("the retry: %v; want ErrInvalid (one of two arguments)", err)
	}
	if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record after two refused calls: %v, want ErrNotFound", err)
	}
}
