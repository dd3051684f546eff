package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// bed is a wallet on its own schema: the seed's wallets table, a ledger
// with one row per payment, and an idempotency Store. calls counts how many
// times a payment function ran.
type bed struct {
	t      *testing.T
	pool   *pgxpool.Pool
	schema string
	store  *idempotency.Store
	calls  atomic.Int64
}

const initial = 10_000

func newBed(t *testing.T, opts ...idempotency.Option) *bed {
	t.Helper()
	ctx := context.Background()
	// Enough connections for the fault trials: each worker's call holds
	// one while the test's probes and checks use others.
	pool, schema := testenv.PostgresSchema(t, 3*trialWorkers)
	store, err := idempotency.New(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() }) // before the pool's: it waits for commits in flight
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
	mustExec(t, pool, `INSERT INTO wallets VALUES ('alice', $1), ('bob', $1)`, initial)
	mustExec(t, pool, `CREATE TABLE ledger (payment text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`)
	return &bed{t: t, pool: pool, schema: schema, store: store}
}

var errInsufficient = errors.New("insufficient funds")

// debit is the seed's conditional debit: the row lock serialises
// concurrent debits, and the balance never goes below zero.
func debit(ctx context.Context, tx pgx.Tx, account string, amount int64) error {
	tag, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2`, account, amount)
	if err == nil && tag.RowsAffected() == 0 {
		err = errInsufficient
	}
	return err
}

// pay is the seed's wallet debit: take amount from account and write the
// payment's ledger row, in Do's transaction. Insufficient funds is a
// terminal outcome ("declined"), stored and replayed.
func (b *bed) pay(account, payment string, amount int64) idempotency.Func {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		b.calls.Add(1)
		if err := debit(ctx, tx, account, amount); errors.Is(err, errInsufficient) {
			return []byte("declined"), idempotency.Terminal(err)
		} else if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, payment, account, amount); err != nil {
			return nil, err
		}
		return []byte(fmt.Sprintf("paid %s %d", payment, amount)), nil
	}
}

func (b *bed) balance(account string) int64 {
	b.t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), `SELECT balance FROM wallets WHERE account = $1`, account).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	return n
}

func fingerprint(account, payment string, amount int64) []byte {
	return idempotency.Fingerprint([]byte(account), []byte(payment), []byte(strconv.FormatInt(amount, 10)))
}

// payOnce runs payment through Do with its own key and fingerprint.
func (b *bed) payOnce(ctx context.Context, payment string, amount int64) (idempotency.Result, error) {
	return b.store.Do(ctx, "alice", payment, fingerprint("alice", payment, amount), b.pay("alice", payment, amount))
}

// check asserts the ledger's rows and the balance.
func (b *bed) check(rows int64, balance int64) {
	b.t.Helper()
	var n, sum int64
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(amount), 0) FROM ledger`).Scan(&n, &sum); err != nil {
		b.t.Fatal(err)
	}
	got := b.balance("alice")
	if n != rows || got != balance || got != initial-sum {
		b.t.Fatalf("ledger rows %d (sum %d), balance %d; want %d rows, balance %d", n, sum, got, rows, balance)
	}
}

// holdAlice begins a transaction on pool that locks alice's wallet row,
// for a test to commit or roll back; one still open when the test ends
// (a failure) rolls back before the pool closes.
func holdAlice(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) }) // after a commit, a no-op
	if _, err := tx.Exec(ctx, `SELECT FROM wallets WHERE account = 'alice' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	return tx
}

func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatal(err)
	}
}

func TestDoRunsOnceThenReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	first, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil {
		t.Fatal(err)
	}
	if first.Replayed || first.Terminal || string(first.Body) != "paid pay-1 500" {
		t.Fatalf("first call: %+v", first)
	}
	if !first.ExpiresAt.After(first.CreatedAt.Add(23*time.Hour)) || first.ExpiresAt.After(first.CreatedAt.Add(25*time.Hour)) {
		t.Fatalf("created %v, expires %v: want the default 24 h retention", first.CreatedAt, first.ExpiresAt)
	}
	for i := 0; i < 3; i++ {
		again, err := b.payOnce(ctx, "pay-1", 500)
		if err != nil {
			t.Fatal(err)
		}
		if !again.Replayed || string(again.Body) != string(first.Body) || !again.CreatedAt.Equal(first.CreatedAt) || !again.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("retry %d: %+v, want a replay of %+v", i, again, first)
		}
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(1, initial-500)

	// The same key in another scope is another key.
	other, err := b.store.Do(ctx, "bob", "pay-1", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if err != nil || other.Replayed || other.Body != nil {
		t.Fatalf("same key, other scope: %+v, %v; want a fresh run with a nil result", other, err)
	}
	rec, err := b.store.Get(ctx, "alice", "pay-1")
	if err != nil || string(rec.Body) != "paid pay-1 500" || string(rec.Fingerprint) != string(fingerprint("alice", "pay-1", 500)) {
		t.Fatalf("Get: %+v, %v", rec, err)
	}
	if _, err := b.store.Get(ctx, "alice", "pay-2"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("Get of an unused key: %v, want ErrNotFound", err)
	}
}

// The count: 8 payments, each delivered 6 times at once (client
// retries, duplicate deliveries). Exactly 8 run, the other 40 replay, and
// the money adds up.
func TestConcurrentRetriesTakeEffectOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	const payments, deliveries, amount = 8, 6, 300
	var ran, replayed atomic.Int64
	var wg sync.WaitGroup
	bodies := make([][]string, payments)
	var mu sync.Mutex
	for p := 0; p < payments; p++ {
		for d := 0; d < deliveries; d++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.payOnce(ctx, fmt.Sprint("pay-", p), amount)
				if err != nil {
					t.Error(err)
					return
				}
				if res.Replayed {
					replayed.Add(1)
				} else {
					ran.Add(1)
				}
				mu.Lock()
				bodies[p] = append(bodies[p], string(res.Body))
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if ran.Load() != payments || replayed.Load() != payments*(deliveries-1) || b.calls.Load() != payments {
		t.Fatalf("ran %d, replayed %d, fn called %d times; want %d, %d, %d",
			ran.Load(), replayed.Load(), b.calls.Load(), payments, payments*(deliveries-1), payments)
	}
	for p, bs := range bodies {
		for _, body := range bs {
			if want := fmt.Sprintf("paid pay-%d %d", p, amount); body != want {
				t.Fatalf("payment %d answered %q, want %q", p, body, want)
			}
		}
	}
	b.check(payments, initial-payments*amount)
}

// holdFirst starts payment "pay-1" and keeps its transaction open (fn has
// debited and written the ledger row) until release is called with fn's
// error. It returns once the key is claimed.
func (b *bed) holdFirst(ctx context.Context) (release func(error), done <-chan error) {
	claimed, proceed := make(chan struct{}), make(chan error)
	out := make(chan error, 1)
	go func() {
		pay := b.pay("alice", "pay-1", 500)
		_, err := b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			body, err := pay(ctx, tx)
			close(claimed)
			if err == nil {
				err = <-proceed
			}
			return body, err
		})
		out <- err
	}()
	<-claimed
	var once sync.Once
	release = func(err error) { once.Do(func() { proceed <- err }) }
	b.t.Cleanup(func() { release(errors.New("test over")) })
	return release, out
}

// waitBusy waits until an attempt of store's calls found its key held by
// a request in flight since store counted since attempts: a duplicate is
// then waiting for it, holding no connection.
func waitBusy(t *testing.T, store *idempotency.Store, what string, since int64) {
	t.Helper()
	testenv.Until(t, what, func() (bool, error) { return store.BusyAttempts() > since, nil })
}

func TestDuplicateWaitsThenReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	release, first := b.holdFirst(ctx)
	second := make(chan idempotency.Result, 1)
	go func() {
		res, err := b.payOnce(ctx, "pay-1", 500)
		if err != nil {
			t.Error(err)
		}
		second <- res
	}()
	waitBusy(t, b.store, "the duplicate finds the key held", 0)
	select {
	case res := <-second:
		t.Fatalf("the duplicate returned %+v while the first was still running", res)
	default:
	}
	release(nil)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	res := <-second
	if !res.Replayed || string(res.Body) != "paid pay-1 500" {
		t.Fatalf("duplicate after the first committed: %+v, want a replay", res)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(1, initial-500)
}

func TestDuplicateRunsAfterFirstRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	release, first := b.holdFirst(ctx)
	second := make(chan idempotency.Result, 1)
	go func() {
		res, err := b.payOnce(ctx, "pay-1", 500)
		if err != nil {
			t.Error(err)
		}
		second <- res
	}()
	waitBusy(t, b.store, "the duplicate finds the key held", 0)
	boom := errors.New("card network down")
	release(boom)
	if err := <-first; !errors.Is(err, boom) {
		t.Fatalf("first: %v, want its own error", err)
	}
	res := <-second
	if res.Replayed || string(res.Body) != "paid pay-1 500" {
		t.Fatalf("duplicate after the first rolled back: %+v, want a fresh run", res)
	}
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (the rolled-back one and the duplicate)", n)
	}
	b.check(1, initial-500)
}

// A duplicate of a request still running waits for it no longer than the
// bound, WithWait's or the context's deadline's, and then returns
// ErrInProgress, having run nothing. The bound is scaled: with the
// context's deadline as the bound, the server gives up a fifth of it
// before the deadline, and the answer must come back within that margin.
func TestWaitIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bound := testenv.Scale(300 * time.Millisecond)
	for _, tc := range []struct {
		name  string
		opts  []idempotency.Option
		ctxTO time.Duration
	}{
		{"WithWait", []idempotency.Option{idempotency.WithWait(bound)}, 0},
		{"context deadline", []idempotency.Option{idempotency.WithWait(0)}, bound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBed(t, tc.opts...)
			release, first := b.holdFirst(ctx)
			cctx := ctx
			if tc.ctxTO > 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, tc.ctxTO)
				defer cancel()
			}
			start := time.Now()
			_, err := b.payOnce(cctx, "pay-1", 500)
			took := time.Since(start)
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("duplicate of a request still running: %v, want ErrInProgress", err)
			}
			if took < bound*2/3 || took > bound+testenv.Scale(3*time.Second) {
				t.Fatalf("gave up after %v, want about %v", took, bound)
			}
			release(nil)
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			res, err := b.payOnce(ctx, "pay-1", 500)
			if err != nil || !res.Replayed {
				t.Fatalf("retry once the first committed: %+v, %v; want a replay", res, err)
			}
			if n := b.calls.Load(); n != 1 {
				t.Fatalf("fn ran %d times, want 1", n)
			}
			b.check(1, initial-500)
		})
	}
}

func TestMismatchCarriesStoredRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	if _, err := b.payOnce(ctx, "pay-1", 500); err != nil {
		t.Fatal(err)
	}
	// Same key, another amount: refused, nothing runs.
	_, err := b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 700), b.pay("alice", "pay-1", 700))
	var mm *idempotency.MismatchError
	if !errors.Is(err, idempotency.ErrMismatch) || !errors.As(err, &mm) {
		t.Fatalf("reused key: %v, want a *MismatchError", err)
	}
	if string(mm.Stored.Body) != "paid pay-1 500" || string(mm.Stored.Fingerprint) != string(fingerprint("alice", "pay-1", 500)) ||
		string(mm.Fingerprint) != string(fingerprint("alice", "pay-1", 700)) || mm.Stored.Key != "pay-1" || mm.Stored.Scope != "alice" {
		t.Fatalf("mismatch error: %+v", mm)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(1, initial-500)
}

func TestErrorRollsBackEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	boom := errors.New("fraud check failed")
	pay := b.pay("alice", "pay-1", 500)
	_, err := b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := pay(ctx, tx); err != nil {
			return nil, err
		}
		return nil, boom // after the debit and the ledger row
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do: %v, want fn's error", err)
	}
	b.check(0, initial)
	if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record after a rolled-back run: %v, want ErrNotFound", err)
	}
	res, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || res.Replayed {
		t.Fatalf("retry after a rollback: %+v, %v; want a fresh run", res, err)
	}
	b.check(1, initial-500)
}

func TestTerminalOutcomeIsReplayed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	res, err := b.payOnce(ctx, "pay-big", initial+1)
	if err != nil || !res.Terminal || res.Replayed || string(res.Body) != "declined" {
		t.Fatalf("payment above the balance: %+v, %v; want a stored terminal 'declined'", res, err)
	}
	// The wallet is topped up; the same payment retried is still declined:
	// its outcome was decided.
	mustExec(t, b.pool, `UPDATE wallets SET balance = balance + $1 WHERE account = 'alice'`, initial)
	res, err = b.payOnce(ctx, "pay-big", initial+1)
	if err != nil || !res.Terminal || !res.Replayed || string(res.Body) != "declined" {
		t.Fatalf("retry of a declined payment: %+v, %v; want the replayed 'declined'", res, err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	var n int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("ledger rows %d (%v), want 0", n, err)
	}
}

func TestExpiredRecordCountsAsAbsent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, idempotency.WithRetention(time.Second))
	first, err := b.payOnce(ctx, "pay-1", 100)
	if err != nil {
		t.Fatal(err)
	}
	if d := first.ExpiresAt.Sub(first.CreatedAt); d != time.Second {
		t.Fatalf("record lives %v, want 1s", d)
	}
	if res, err := b.payOnce(ctx, "pay-1", 100); err != nil || !res.Replayed || !res.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("retry within retention: %+v, %v; want a replay", res, err)
	}
	testenv.Until(t, "the record expires by the database's clock", func() (bool, error) {
		_, err := b.store.Get(ctx, "alice", "pay-1")
		if errors.Is(err, idempotency.ErrNotFound) {
			return true, nil
		}
		return false, err
	})
	// After expiry the key is free, even for another request: the ledger
	// (the caller's own table) is where a second use would collide, so this
	// one uses a new ledger row.
	res, err := b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1b", 200), b.pay("alice", "pay-1b", 200))
	if err != nil || res.Replayed || !res.CreatedAt.After(first.CreatedAt) {
		t.Fatalf("reuse after expiry: %+v, %v; want a fresh run", res, err)
	}
	var rows int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM nolock_idempotency`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("%d records (%v), want 1: the expired one replaced in place", rows, err)
	}
	b.check(2, initial-300)

	// Six concurrent deliveries of a request whose key's record just
	// expired: exactly one takes the key over and runs, five replay it.
	// (The record is expired by hand, and the new one lives 24 h, so a slow
	// machine cannot expire it again mid-test.)
	long, err := idempotency.New(b.pool)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, b.pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s'`)
	ran, replayed := race(t, 6, func(int) (idempotency.Result, error) {
		return long.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1c", 400), b.pay("alice", "pay-1c", 400))
	})
	if ran != 1 || replayed != 5 {
		t.Fatalf("concurrent takeover of an expired key: %d ran, %d replayed; want 1 and 5", ran, replayed)
	}
	b.check(3, initial-700)
}

// race makes n calls of call at once (i from 0 to n-1) and counts the
// fresh runs and the replays; an error fails the test.
func race(t *testing.T, n int, call func(i int) (idempotency.Result, error)) (ran, replayed int64) {
	t.Helper()
	var r, rp atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := call(i)
			switch {
			case err != nil:
				t.Error(err)
			case res.Replayed:
				rp.Add(1)
			default:
				r.Add(1)
			}
		}()
	}
	wg.Wait()
	return r.Load(), rp.Load()
}

func TestReapDeletesOnlyExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	short, err := idempotency.New(b.pool, idempotency.WithRetention(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil }
	const expired, live = 23, 5
	for i := 0; i < expired; i++ {
		if _, err := short.Do(ctx, "s", fmt.Sprint("old-", i), nil, noop); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < live; i++ {
		if _, err := b.store.Do(ctx, "s", fmt.Sprint("new-", i), nil, noop); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // past the short records' 1 ms
	n, err := b.store.Reap(ctx, 7)    // batches of 7, 7, 7, 2
	if err != nil || n != expired {
		t.Fatalf("Reap: %d, %v; want %d", n, err, expired)
	}
	if n, err := b.store.Reap(ctx, 7); err != nil || n != 0 {
		t.Fatalf("second Reap: %d, %v; want 0", n, err)
	}
	var rows int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM nolock_idempotency WHERE key LIKE 'new-%'`).Scan(&rows); err != nil || rows != live {
		t.Fatalf("%d live records left (%v), want %d", rows, err, live)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.store.Reap(cctx, 7); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reap with a cancelled context: %v", err)
	}
}

// fn cannot end Do's transaction, cannot hide a failed statement, cannot
// use the transaction after returning, and gets savepoints from Begin.
func TestFnMisuseIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	res, err := b.store.Do(ctx, "s", "commit", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if err := tx.Commit(ctx); err == nil {
			return nil, errors.New("Commit inside fn succeeded")
		}
		if err := tx.Rollback(ctx); err == nil {
			return nil, errors.New("Rollback inside fn succeeded")
		}
		return []byte("ok"), nil
	})
	if err != nil || string(res.Body) != "ok" {
		t.Fatalf("fn that tried to end the transaction: %+v, %v", res, err)
	}

	_, err = b.store.Do(ctx, "s", "swallow", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, _ = tx.Exec(ctx, `INSERT INTO ledger VALUES ('x', 'alice', 1)`)
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // fails, and fn ignores it
		return []byte("ok"), nil
	})
	if err == nil {
		t.Fatal("fn that swallowed a failed statement: Do succeeded")
	}
	if _, err := b.store.Get(ctx, "s", "swallow"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record of the failed run: %v, want ErrNotFound", err)
	}

	var leaked pgx.Tx
	_, err = b.store.Do(ctx, "s", "nested", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		leaked = tx
		sp, err := tx.Begin(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO ledger VALUES ('inner', 'alice', 1)`); err != nil {
			return nil, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return nil, err
		}
		_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ('outer', 'alice', 1)`)
		return nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	if err := b.pool.QueryRow(ctx, `SELECT string_agg(payment, ',') FROM ledger`).Scan(&got); err != nil || got != "outer" {
		t.Fatalf("ledger %q (%v): want only the row outside the rolled-back savepoint", got, err)
	}
	if _, err := leaked.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("tx used after fn returned: %v, want ErrTxClosed", err)
	}
	if err := leaked.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow after fn returned: %v, want ErrTxClosed", err)
	}
}

// Two payments that lock the same two rows in opposite orders deadlock;
// PostgreSQL aborts one, and Do runs it again from a clean rollback, after
// a pause, within its attempts: both payments succeed and the balances
// add up. Under load the retry may still meet the other before it has
// taken the row it was waiting for, and deadlock again (fn then runs more
// than three times); that costs an attempt, not the payment.
func TestDeadlockIsRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	var arrived sync.WaitGroup
	arrived.Add(2)
	var attempts atomic.Int64
	transfer := func(from, to string) idempotency.Func {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			first := attempts.Add(1) <= 2
			if err := debit(ctx, tx, from, 10); err != nil {
				return nil, err
			}
			if first { // both hold their first row before taking the second
				arrived.Done()
				arrived.Wait()
			}
			_, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance + 10 WHERE account = $1`, to)
			return nil, err
		}
	}
	var wg sync.WaitGroup
	for i, pair := range [][2]string{{"alice", "bob"}, {"bob", "alice"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.store.Do(ctx, "s", fmt.Sprint("t", i), nil, transfer(pair[0], pair[1])); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := attempts.Load(); n < 3 {
		t.Fatalf("fn ran %d times, want 3 or more: the deadlock's victim retried", n)
	} else if n > 3 {
		t.Logf("fn ran %d times: a retry deadlocked again", n)
	}
	for _, acct := range []string{"alice", "bob"} {
		if got := b.balance(acct); got != initial {
			t.Fatalf("%s: %d; want %d (two opposite transfers of 10)", acct, got, initial)
		}
	}
	var records int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM nolock_idempotency`).Scan(&records); err != nil || records != 2 {
		t.Fatalf("%d records (%v), want 2: both transfers committed once", records, err)
	}
}

// The wait bound applies to the claim only: fn runs with the connection's
// own lock_timeout, whether the claim was bounded by WithWait or by the
// context's deadline.
func TestFnRunsWithConnectionsLockTimeout(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	one := testenv.Pool(t, testenv.PostgresDSNFor(t, b.schema), 1) // so the SET below is every Do's connection
	mustExec(t, one, `SET lock_timeout = '7s'`)
	store, err := idempotency.New(one, idempotency.WithWait(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for i, timeout := range []time.Duration{0, time.Minute} {
		ctx := context.Background()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		_, err := store.Do(ctx, "s", fmt.Sprint("k", i), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			var inFn string
			if err := tx.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&inFn); err != nil {
				return nil, err
			}
			if inFn != "7s" {
				return nil, fmt.Errorf("lock_timeout in fn %q, want the connection's own 7s", inFn)
			}
			return nil, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
