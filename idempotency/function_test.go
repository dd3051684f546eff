package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// execFunctions returns the names of the functions Exec made in the bed's
// schema.
func (b *bed) execFunctions() []string {
	b.t.Helper()
	var names []string
	if err := b.pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(proname::text), '{}') FROM pg_proc
WHERE proname LIKE 'nolock\_exec\_%' AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`).Scan(&names); err != nil {
		b.t.Fatal(err)
	}
	return names
}

// Exec's default: one function per statement text, made once by however
// many Stores and processes meet the statement at once, each call one
// transaction. Eight Stores make it together without an error; every
// call then runs once, in one transaction, and a second statement text
// gets a function of its own.
func TestExecMakesOneFunctionPerStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		s, err := idempotency.New(b.pool)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Exec(ctx, "alice", fmt.Sprint("pay-", i), nil, debitSQL, "alice", int64(1))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a Store making the function at the same time as 7 others: %v", err)
		}
	}
	if n := len(b.execFunctions()); n != 1 {
		t.Fatalf("%d functions after 8 Stores met one statement, want 1", n)
	}
	// Each call is one statement: count what a Store on a traced pool sends.
	counter := &queryCounter{}
	traced := testenv.PoolWith(t, testenv.PostgresDSNFor(t, b.schema), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = counter })
	s, err := idempotency.New(traced)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Exec(ctx, "alice", "warm", nil, debitSQL, "alice", int64(1)); err != nil { // describes the statement
		t.Fatal(err)
	}
	const calls = 20
	before := counter.n.Load()
	for i := range calls {
		if _, err := s.Exec(ctx, "alice", fmt.Sprint("one-", i), nil, debitSQL, "alice", int64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if n := counter.n.Load() - before; n != calls {
		t.Fatalf("%d statements sent for %d first runs, want one each", n, calls)
	}
	if _, err := b.store.Exec(ctx, "alice", "other", nil, `SELECT $1::bigint AS n`, int64(7)); err != nil {
		t.Fatal(err)
	}
	if n := len(b.execFunctions()); n != 2 {
		t.Fatalf("%d functions after two statement texts, want 2", n)
	}
	if got := b.balance("alice"); got != initial-8-1-calls {
		t.Fatalf("balance %d, want %d: each call debited once", got, initial-8-1-calls)
	}
}

// runsThenReplays fails t unless call's first run runs and a second call
// replays it.
func runsThenReplays(t *testing.T, what string, call func() (idempotency.Result, error)) {
	t.Helper()
	if res, err := call(); err != nil || res.Replayed {
		t.Fatalf("%s: %+v, %v; want a first run", what, res, err)
	}
	if again, err := call(); err != nil || !again.Replayed {
		t.Fatalf("%s, again: %+v, %v; want a replay", what, again, err)
	}
}

// queryCounter counts the statements a pool sends.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A function dropped since (by hand, or lost in a failover to a standby
// that lacked it) is made again by the next call, which runs once.
func TestExecRemakesADroppedFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	if _, err := b.execPay(ctx, "pay-1", 10); err != nil {
		t.Fatal(err)
	}
	names := b.execFunctions()
	if len(names) != 1 {
		t.Fatalf("functions %q after one statement, want 1", names)
	}
	name := names[0]
	mustExec(t, b.pool, `DROP FUNCTION `+pgx.Identifier{name}.Sanitize())
	runsThenReplays(t, "Exec after its function was dropped", func() (idempotency.Result, error) { return b.execPay(ctx, "pay-2", 10) })
	if n := len(b.execFunctions()); n != 1 {
		t.Fatalf("%d functions, want the one made again", n)
	}
	if got := b.balance("alice"); got != initial-20 {
		t.Fatalf("balance %d, want %d: two debits", got, initial-20)
	}
}

// A role that may not create functions in its schema gets the claim plan:
// the same outcomes, quiet on the server, no function made.
func TestExecWithoutCreatePrivilegeClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	pool := testenv.Pool(t, testenv.AppRoleDSN(t, testenv.PostgresDSN(t), b.schema), 0)
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	runsThenReplays(t, "Exec without CREATE", func() (idempotency.Result, error) {
		return store.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 10), debitSQL, "alice", int64(10))
	})
	if n := len(b.execFunctions()); n != 0 {
		t.Fatalf("%d functions made by a role without CREATE, want 0", n)
	}
	if got := b.balance("alice"); got != initial-10 {
		t.Fatalf("balance %d, want %d: one debit", got, initial-10)
	}
}

// A function of the right name that is not Exec's own (planted by a role
// that may create functions in the schema) is never called: Exec claims
// the key instead, and the forged replay it would return never reaches
// the caller.
func TestExecRefusesAFunctionItDidNotMake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	name := b.store.FuncName(debitSQL, []uint32{pgtype.TextOID, pgtype.Int8OID})
	mustExec(t, b.pool, `CREATE FUNCTION `+pgx.Identifier{name}.Sanitize()+`(text, bigint, text, text, text, bytea, bigint,
  OUT nolock_fingerprint bytea, OUT nolock_terminal boolean, OUT nolock_result bytea, OUT nolock_created_at timestamptz,
  OUT nolock_expires_at timestamptz, OUT nolock_replayed boolean, OUT nolock_took_over boolean)
LANGUAGE sql AS $$ SELECT $6, false, '[{"forged":true}]'::bytea, now(), now(), true, false $$`)
	res, err := b.execPay(ctx, "pay-1", 10)
	if err != nil || res.Replayed || string(res.Body) != fmt.Sprintf(`[{"balance":%d}]`, initial-10) {
		t.Fatalf("Exec beside a planted function: %+v, %v; want a first run of the debit", res, err)
	}
	if got := b.balance("alice"); got != initial-10 {
		t.Fatalf("balance %d, want %d", got, initial-10)
	}
}

// A call whose statement is still running (here waiting for a row the
// test holds) holds the key's lock in the function; a duplicate waits for
// it no longer than WithWait, returns ErrInProgress having run nothing,
// and replays the first's result once it commits.
func TestExecFunctionWaitForTheKeyIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bound := testenv.Scale(300 * time.Millisecond)
	b := newBed(t, idempotency.WithWait(bound))
	patient, err := idempotency.New(b.pool, idempotency.WithWait(testenv.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	b.store.PinPlan("function")
	patient.PinPlan("function")
	// Make the function first, so that both calls below go through it.
	if _, err := patient.Exec(ctx, "alice", "pay-0", nil, debitSQL, "alice", int64(1)); err != nil {
		t.Fatal(err)
	}
	hold := holdAlice(t, b.pool)
	fp := fingerprint("alice", "pay-1", 500)
	first := make(chan error, 1)
	go func() {
		res, err := patient.Exec(ctx, "alice", "pay-1", fp, debitSQL, "alice", int64(500))
		if err == nil && res.Replayed {
			err = fmt.Errorf("the first call replayed")
		}
		first <- err
	}()
	testenv.WaitLockWaiters(t, b.pool, 1) // the first call holds the key and waits for the row
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, bound+testenv.Scale(10*time.Second)) // fails, not hangs, if the wait is unbounded
	defer cancel()
	_, err = b.store.Exec(dctx, "alice", "pay-1", fp, debitSQL, "alice", int64(500))
	if took := time.Since(start); !errors.Is(err, idempotency.ErrInProgress) || took < bound*2/3 {
		t.Fatalf("duplicate of a call in flight: %v after %v, want ErrInProgress after about %v", err, took, bound)
	}
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Exec(ctx, "alice", "pay-1", fp, debitSQL, "alice", int64(500))
	if err != nil || !res.Replayed {
		t.Fatalf("duplicate once the first committed: %+v, %v; want a replay", res, err)
	}
	if got := b.balance("alice"); got != initial-501 {
		t.Fatalf("balance %d, want %d: one debit of 500 and one of 1", got, initial-501)
	}
}
