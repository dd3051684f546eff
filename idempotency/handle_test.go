package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// connect opens a *pgx.Conn on the bed's schema, closed when the test ends.
func (b *bed) connect() *pgx.Conn {
	b.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresDSNFor(b.t, b.schema))
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// A Store on a *pgx.Conn runs Do and Exec as on a pool: first runs,
// replays, mismatches, terminal outcomes; concurrent callers queue for the
// connection, and 8 payments × 6 concurrent deliveries take effect 8 times.
func TestStoreOnAConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	conn := b.connect()
	store, err := idempotency.New(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	pay := func(key string, amount int64) (idempotency.Result, error) {
		return store.Do(ctx, "alice", key, fingerprint("alice", key, amount), b.pay("alice", key, amount))
	}
	if res, err := pay("pay-1", 100); err != nil || res.Replayed || string(res.Body) != "paid pay-1 100" {
		t.Fatalf("Do on a conn: %+v, %v; want a first run", res, err)
	}
	if res, err := pay("pay-1", 100); err != nil || !res.Replayed || string(res.Body) != "paid pay-1 100" {
		t.Fatalf("Do again on a conn: %+v, %v; want a replay", res, err)
	}
	if _, err := pay("pay-1", 200); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Do with another amount on a conn: %v; want ErrMismatch", err)
	}
	if res, err := pay("pay-big", 2*initial); err != nil || !res.Terminal || string(res.Body) != "declined" {
		t.Fatalf("an overdraft on a conn: %+v, %v; want a terminal decline", res, err)
	}
	for i, replay := range []bool{false, true} {
		res, err := store.Exec(ctx, "alice", "exec-1", nil, debitSQL, "alice", int64(50))
		if err != nil || res.Replayed != replay || string(res.Body) != fmt.Sprintf(`[{"balance":%d}]`, initial-150) {
			t.Fatalf("Exec call %d on a conn: %+v, %v; want replayed %v", i, res, err, replay)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	replays := 0
	for p := 0; p < 8; p++ {
		for d := 0; d < 6; d++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprint("c-", p)
				res, err := pay(key, 10)
				if err != nil {
					t.Errorf("%s, delivery %d: %v", key, d, err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if res.Replayed {
					replays++
				}
			}()
		}
	}
	wg.Wait()
	if replays != 40 {
		t.Fatalf("%d replays of 48 deliveries of 8 payments, want 40", replays)
	}
	b.checkLedger(1+8, initial-100-50-80)
}

// checkLedger asserts the ledger's rows and alice's balance, which Exec's
// debits (with no ledger row) lower too.
func (b *bed) checkLedger(rows int64, balance int64) {
	b.t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger`).Scan(&n); err != nil {
		b.t.Fatal(err)
	}
	if got := b.balance("alice"); n != rows || got != balance {
		b.t.Fatalf("ledger rows %d, balance %d; want %d rows, balance %d", n, got, rows, balance)
	}
}

// A Store on the caller's pgx.Tx runs Do and Exec in savepoints of it:
// nothing commits until the caller does; a rollback of the caller's
// transaction takes the effect and the record with it; an error of fn
// rolls back only the attempt, and the transaction goes on; a duplicate
// through a pool waits for the caller's transaction (ErrInProgress while
// it is open, a replay once it committed).
func TestStoreInACallersTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, idempotency.WithWait(testenv.Scale(200*time.Millisecond)))
	conn := b.connect()
	inTx := func(t *testing.T, commit bool, fn func(store *idempotency.Store)) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		store, err := idempotency.New(tx)
		if err != nil {
			t.Fatal(err)
		}
		fn(store)
		if !commit {
			return
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pay := func(store *idempotency.Store, key string, amount int64) (idempotency.Result, error) {
		return store.Do(ctx, "alice", key, fingerprint("alice", key, amount), b.pay("alice", key, amount))
	}

	// Rolled back by the caller: nothing stays.
	inTx(t, false, func(store *idempotency.Store) {
		if res, err := pay(store, "pay-1", 100); err != nil || res.Replayed {
			t.Fatalf("Do in a tx: %+v, %v; want a first run", res, err)
		}
	})
	b.check(0, initial)

	// Committed by the caller: fn's error rolls back only its attempt; a
	// duplicate through the pool waits for the caller's transaction.
	inTx(t, true, func(store *idempotency.Store) {
		failing := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if err := debit(ctx, tx, "alice", 7); err != nil {
				return nil, err
			}
			return nil, errors.New("declined by fn")
		}
		if _, err := store.Do(ctx, "alice", "pay-0", nil, failing); err == nil || err.Error() != "declined by fn" {
			t.Fatalf("Do whose fn fails, in a tx: %v; want fn's error", err)
		}
		first, err := pay(store, "pay-1", 100)
		if err != nil || first.Replayed {
			t.Fatalf("Do in a tx after fn's error: %+v, %v; want a first run", first, err)
		}
		if res, err := pay(store, "pay-1", 100); err != nil || !res.Replayed || !res.CreatedAt.Equal(first.CreatedAt) || !res.ExpiresAt.Equal(first.ExpiresAt) {
			t.Fatalf("Do again in the same tx: %+v, %v; want a replay of %+v", res, err, first)
		}
		if res, err := store.Exec(ctx, "alice", "exec-1", nil, debitSQL, "alice", int64(50)); err != nil || res.Replayed {
			t.Fatalf("Exec in a tx: %+v, %v; want a first run", res, err)
		}
		if _, err := store.Exec(ctx, "alice", "exec-2", nil, `SELECT $1::int / 0 AS v`, 1); err == nil {
			t.Fatal("Exec of a failing statement in a tx: no error")
		}
		if _, err := idempotency.Middleware(store); !errors.Is(err, idempotency.ErrInvalid) {
			t.Fatalf("Middleware on a Store on a tx: %v; want ErrInvalid", err)
		}
		if _, err := b.payOnce(ctx, "pay-1", 100); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("a duplicate through the pool while the caller's tx is open: %v; want ErrInProgress", err)
		}
	})
	if res, err := b.payOnce(ctx, "pay-1", 100); err != nil || !res.Replayed {
		t.Fatalf("a duplicate through the pool after the caller's commit: %+v, %v; want a replay", res, err)
	}
	b.checkLedger(1, initial-100-50)
	if n := b.calls.Load(); n != 2 { // the rolled-back run and the committed one
		t.Fatalf("fn ran %d times, want 2", n)
	}
}
