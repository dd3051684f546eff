package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// debitSQL is the seed's debit as one statement; its RETURNING row is the
// stored result, and no row (insufficient funds) a terminal outcome.
const debitSQL = `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2 RETURNING balance`

// forEachPlan runs test once for each way Exec sends a call, in parallel:
// the key claimed first, or its record read first (as Exec does once most
// calls were replays); pin, applied to each Store the test makes, chooses.
func forEachPlan(t *testing.T, test func(t *testing.T, pin func(*idempotency.Store))) {
	for _, how := range []string{"claim", "readfirst"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			test(t, func(s *idempotency.Store) { s.PinPlan(how) })
		})
	}
}

// execPay debits alice through Exec under key, fingerprinted by the amount.
func (b *bed) execPay(ctx context.Context, key string, amount int64) (idempotency.Result, error) {
	return b.store.Exec(ctx, "alice", key, fingerprint("alice", key, amount), debitSQL, "alice", amount)
}

func TestExecRunsOnceThenReplays(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		res, err := b.execPay(ctx, "pay-1", 500)
		want := fmt.Sprintf(`[{"balance":%d}]`, initial-500)
		if err != nil || res.Replayed || res.Terminal || string(res.Body) != want {
			t.Fatalf("first Exec: %+v, %v; want a fresh run with body %s", res, err, want)
		}
		again, err := b.execPay(ctx, "pay-1", 500)
		if err != nil || !again.Replayed || string(again.Body) != want || !again.CreatedAt.Equal(res.CreatedAt) || !again.ExpiresAt.Equal(res.ExpiresAt) {
			t.Fatalf("retry: %+v, %v; want a replay of %+v", again, err, res)
		}
		_, err = b.execPay(ctx, "pay-1", 700)
		var mm *idempotency.MismatchError
		if !errors.As(err, &mm) || string(mm.Stored.Body) != want {
			t.Fatalf("same key, other amount: %v; want a MismatchError carrying %s", err, want)
		}
		if got := b.balance("alice"); got != initial-500 {
			t.Fatalf("balance %d, want %d: one debit", got, initial-500)
		}
	})
}

func TestExecNoRowIsTerminal(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		for i, wantReplay := range []bool{false, true} {
			res, err := b.execPay(ctx, "too-much", initial+1)
			if err != nil || res.Replayed != wantReplay || !res.Terminal || string(res.Body) != "[]" {
				t.Fatalf("call %d: %+v, %v; want Terminal with body [] (replayed: %v)", i, res, err, wantReplay)
			}
		}
		if got := b.balance("alice"); got != initial {
			t.Fatalf("balance %d after a refused debit, want %d", got, initial)
		}
	})
}

// The statement's own error rolls back everything: no effect, no record,
// and the key is free for a retry.
func TestExecStatementErrorStoresNothing(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		_, err := b.store.Exec(ctx, "alice", "pay-1", nil, `UPDATE wallets SET balance = balance - $1 WHERE account = 'alice' RETURNING balance`, initial+1)
		if err == nil || errors.Is(err, idempotency.ErrAmbiguousCommit) {
			t.Fatalf("a debit below zero: %v, want the check violation", err)
		}
		if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("record after a failed statement: %v, want ErrNotFound", err)
		}
		if res, err := b.store.Exec(ctx, "alice", "pay-1", nil, debitSQL, "alice", 1); err != nil || res.Replayed {
			t.Fatalf("retry with the same key: %+v, %v; want a fresh run", res, err)
		}
		if got := b.balance("alice"); got != initial-1 {
			t.Fatalf("balance %d, want %d", got, initial-1)
		}
	})
}

// Many clients send each of a few payments several times at once: each
// payment debits exactly once, every other call is a replay of it.
func TestExecConcurrentDuplicatesTakeEffectOnce(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		const payments, copies = 8, 6
		fresh, replays := race(t, payments*copies, func(i int) (idempotency.Result, error) {
			return b.execPay(ctx, fmt.Sprint("pay-", i%payments), 10)
		})
		if fresh != payments || replays != payments*(copies-1) {
			t.Fatalf("%d fresh runs and %d replays, want %d and %d", fresh, replays, payments, payments*(copies-1))
		}
		if got := b.balance("alice"); got != initial-payments*10 {
			t.Fatalf("balance %d, want %d", got, initial-payments*10)
		}
	})
}

// A duplicate of a request still in its transaction waits for it, bounded
// by WithWait; once it commits, Exec replays its result.
func TestExecWaitsForInFlightDuplicate(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t, idempotency.WithWait(300*time.Millisecond))
		pin(b.store)
		release, first := b.holdFirst(ctx) // Do holds pay-1 for 500, uncommitted
		start := time.Now()
		_, err := b.store.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), debitSQL, "alice", 500)
		if took := time.Since(start); !errors.Is(err, idempotency.ErrInProgress) || took < 200*time.Millisecond {
			t.Fatalf("duplicate of a request in flight: %v after %v, want ErrInProgress after about 300ms", err, took)
		}
		// A duplicate that may wait long enough (however slow the machine)
		// replays the first's result once it commits.
		patient, err := idempotency.New(b.pool, idempotency.WithWait(testenv.Scale(30*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		pin(patient)
		got := make(chan error, 1)
		go func() {
			res, err := patient.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), debitSQL, "alice", 500)
			if err == nil && (!res.Replayed || string(res.Body) != "paid pay-1 500") {
				err = fmt.Errorf("got %+v, want a replay of the first's result", res)
			}
			got <- err
		}()
		waitBusy(t, patient, "the duplicate finds the key held", 0)
		release(nil)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		b.check(1, initial-500) // one debit: the first's
	})
}

func TestExecExpiredRecordIsTakenOver(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t, idempotency.WithRetention(50*time.Millisecond))
		pin(b.store)
		if _, err := b.execPay(ctx, "pay-1", 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // past the record's 50 ms
		res, err := b.execPay(ctx, "pay-1", 10)
		if err != nil || res.Replayed {
			t.Fatalf("Exec on an expired key: %+v, %v; want a fresh run", res, err)
		}
		if got := b.balance("alice"); got != initial-20 {
			t.Fatalf("balance %d, want %d: the expired key counts as unused", got, initial-20)
		}

		// Six concurrent calls on a key whose record just expired: one deletes
		// it and runs, the others meet the new record (at the read, or as a
		// unique violation that rolls their debit back) and replay it. The new
		// record lives 24 h, so a slow machine cannot expire it mid-test.
		long, err := idempotency.New(b.pool)
		if err != nil {
			t.Fatal(err)
		}
		pin(long)
		mustExec(t, b.pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s'`)
		ran, replayed := race(t, 6, func(int) (idempotency.Result, error) {
			return long.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 10), debitSQL, "alice", 10)
		})
		if ran != 1 || replayed != 5 {
			t.Fatalf("concurrent takeover of an expired key: %d ran, %d replayed; want 1 and 5", ran, replayed)
		}
		if got := b.balance("alice"); got != initial-30 {
			t.Fatalf("balance %d, want %d", got, initial-30)
		}
	})
}

// A duplicate of a request in flight (it waits on the wallet's row, which
// the first's debit holds) meets the first's record, committed meanwhile,
// already expired (it lives 1 ms): the unique violation rolls the
// duplicate's debit back, and the retry, the key now counting as unused,
// runs it.
func TestExecRunsWhenTheRecordWaitedForHasExpired(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t, idempotency.WithRetention(time.Millisecond))
		pin(b.store)
		release, first := b.holdFirst(ctx)
		got := make(chan error, 1)
		go func() {
			res, err := b.store.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), debitSQL, "alice", 500)
			if err == nil && res.Replayed {
				err = fmt.Errorf("got a replay of an expired record: %+v", res)
			}
			got <- err
		}()
		waitBusy(t, b.store, "the duplicate finds the key held", 0)
		time.Sleep(5 * time.Millisecond) // past the first's record's 1 ms
		release(nil)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if got := b.balance("alice"); got != initial-1000 {
			t.Fatalf("balance %d, want %d: both ran, the first's record having expired", got, initial-1000)
		}
	})
}

// Exec meets an expired record that Do is taking over, its transaction
// still open: the delete of the expired record waits for the takeover,
// bounded by WithWait (ErrInProgress, nothing written); once Do commits,
// Exec replays Do's result.
func TestExecWaitsForTakeoverInFlight(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t, idempotency.WithWait(200*time.Millisecond))
		pin(b.store)
		if _, err := b.execPay(ctx, "pay-1", 10); err != nil {
			t.Fatal(err)
		}
		mustExec(t, b.pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s'`)
		release, first := b.holdFirst(ctx) // Do takes pay-1 over, for 500, uncommitted
		fp := fingerprint("alice", "pay-1", 500)
		start := time.Now()
		_, err := b.store.Exec(ctx, "alice", "pay-1", fp, debitSQL, "alice", 500)
		if took := time.Since(start); !errors.Is(err, idempotency.ErrInProgress) || took < 150*time.Millisecond {
			t.Fatalf("Exec during a takeover: %v after %v, want ErrInProgress after about 200ms", err, took)
		}
		release(nil)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Exec(ctx, "alice", "pay-1", fp, debitSQL, "alice", 500)
		if err != nil || !res.Replayed || string(res.Body) != "paid pay-1 500" {
			t.Fatalf("Exec after the takeover committed: %+v, %v; want a replay of Do's result", res, err)
		}
		if got := b.balance("alice"); got != initial-510 {
			t.Fatalf("balance %d, want %d: the first debit and Do's", got, initial-510)
		}
	})
}

// The statement's own unique violation is its error, returned as it is:
// not mistaken for the key's record standing in the way.
func TestExecStatementUniqueViolationIsReturned(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		mustExec(t, b.pool, `INSERT INTO ledger VALUES ('p1', 'alice', 5)`)
		_, err := b.store.Exec(ctx, "alice", "pay-1", nil, `INSERT INTO ledger VALUES ('p1', 'alice', 5) RETURNING payment`)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" || pgErr.TableName != "ledger" {
			t.Fatalf("a duplicate ledger row: %v, want the ledger's unique violation", err)
		}
		if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
			t.Fatalf("record after a failed statement: %v, want ErrNotFound", err)
		}
	})
}

// Fault: the backend is terminated while the statement waits on the
// wallet's row lock. The caller gets ErrAmbiguousCommit; nothing
// committed, and a retry with the same key debits exactly once.
func TestExecKilledStatementConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM wallets WHERE account = 'alice' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := b.execPay(ctx, "pay-1", 500); done <- err }()
		testenv.WaitLockWaiters(t, b.pool, 1)
		mustExec(t, b.pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock'`, b.schema)
		if err := <-done; !errors.Is(err, idempotency.ErrAmbiguousCommit) {
			t.Fatalf("Exec whose backend died: %v, want ErrAmbiguousCommit", err)
		}
		tx.Rollback(ctx)
		for i, wantReplay := range []bool{false, true} {
			res, err := b.execPay(ctx, "pay-1", 500)
			if err != nil || res.Replayed != wantReplay {
				t.Fatalf("retry %d: %+v, %v; want replayed %v", i, res, err, wantReplay)
			}
		}
		if got := b.balance("alice"); got != initial-500 {
			t.Fatalf("balance %d, want %d: exactly one debit", got, initial-500)
		}
	})
}

// A replay, or a call with another fingerprint, never runs the statement,
// not even to roll it back: the sequence, which no rollback winds back,
// counts every run of the effect.
func TestExecReplayRunsNoEffect(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		mustExec(t, b.pool, `CREATE SEQUENCE effects`)
		const counted = `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND nextval('effects') > 0 RETURNING balance`
		for i, amount := range []int64{5, 5, 5, 7} {
			res, err := b.store.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", amount), counted, "alice", amount)
			if i < 3 && (err != nil || res.Replayed != (i > 0)) || i == 3 && !errors.Is(err, idempotency.ErrMismatch) {
				t.Fatalf("call %d: %+v, %v", i, res, err)
			}
		}
		var runs int64
		if err := b.pool.QueryRow(ctx, `SELECT last_value FROM effects`).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs != 1 {
			t.Fatalf("the effect ran %d times, want once: replays and mismatches must not run it", runs)
		}
	})
}

// A replay does not run the statement: it neither changes the wallet nor
// waits for the wallet's row lock, held here by another transaction.
func TestExecReplayTakesNoLock(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t, idempotency.WithWait(0)) // a wait would last until ctx's deadline
		pin(b.store)
		first, err := b.execPay(ctx, "pay-1", 500)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM wallets WHERE account = 'alice' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := b.execPay(cctx, "pay-1", 500)
		if err != nil || !res.Replayed || string(res.Body) != string(first.Body) {
			t.Fatalf("replay while the wallet is locked: %+v, %v; want a replay of %s", res, err, first.Body)
		}
		if _, err := b.execPay(cctx, "pay-1", 900); !errors.Is(err, idempotency.ErrMismatch) {
			t.Fatalf("mismatch while the wallet is locked: %v, want ErrMismatch", err)
		}
		tx.Rollback(ctx)
		if got := b.balance("alice"); got != initial-500 {
			t.Fatalf("balance %d, want %d: the replays ran no debit", got, initial-500)
		}
	})
}

// The caller's statement is spliced in as it is: a trailing line comment
// or the text {{table}} in it changes nothing around it.
func TestExecStatementTextIsKeptApart(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		pin(b.store)
		res, err := b.store.Exec(ctx, "alice", "k1", nil, "SELECT '{{table}}' AS s -- a trailing comment")
		if err != nil || string(res.Body) != `[{"s":"{{table}}"}]` {
			t.Fatalf("Exec: %+v, %v; want the text back untouched", res, err)
		}
		_, err = b.store.Exec(ctx, "alice", "k2", nil, debitSQL, pgx.NamedArgs{"a": 1})
		if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "args[0]") {
			t.Fatalf("Exec with NamedArgs: %v, want ErrInvalid naming args[0]", err)
		}
	})
}
