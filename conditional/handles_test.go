package conditional_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// handles returns a pool on a fresh schema, a *pgx.Conn on it and a
// transaction begun on the pool, each ended when the test ends.
func handles(t *testing.T) (*pgxpool.Pool, *pgx.Conn, pgx.Tx) {
	t.Helper()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 0)
	conn := testenv.PostgresConn(t, schema)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return pool, conn, tx
}

// NewStock and NewAccounts refuse a *pgx.Conn and a pgx.Tx with ErrInvalid
// naming the handle, and touch neither.
func TestStockRefusesOneConnectionHandles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, conn, tx := handles(t)
	ctors := map[string]func(conditional.DB) error{
		"NewStock":    func(db conditional.DB) error { _, err := conditional.NewStock(db); return err },
		"NewAccounts": func(db conditional.DB) error { _, err := conditional.NewAccounts(db); return err },
	}
	for handle, db := range map[string]conditional.DB{"*pgx.Conn": conn, "pgx.Tx": tx} {
		for name, ctor := range ctors {
			err := ctor(db)
			if !errors.Is(err, conditional.ErrInvalid) || err == nil || !strings.Contains(err.Error(), handle) {
				t.Errorf("%s on a %s: %v; want ErrInvalid naming it", name, handle, err)
			}
		}
	}
	// Both handles are still usable, and no table was made.
	for handle, db := range map[string]conditional.DB{"*pgx.Conn": conn, "pgx.Tx": tx} {
		var tables int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil || tables != 0 {
			t.Errorf("after the refusals, on the %s: %d tables (%v); want 0", handle, tables, err)
		}
	}
}

// TakeIn, DebitIn and CreditIn on a *pgx.Conn commit on their own; in a
// pgx.Tx they are applied in it: a rollback leaves nothing, a commit
// keeps them.
func TestInCallsOnEachHandle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, conn, _ := handles(t)
	s := newStock(t, pool)
	a, err := conditional.NewAccounts(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "sku", 10); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "alice", 100); err != nil {
		t.Fatal(err)
	}
	check := func(when string, stock, balance int64) {
		t.Helper()
		if got := available(t, s, "sku"); got != stock {
			t.Fatalf("%s: stock %d, want %d", when, got, stock)
		}
		if got, err := a.Balance(ctx, "alice"); err != nil || got != balance {
			t.Fatalf("%s: balance %d (%v), want %d", when, got, err, balance)
		}
	}
	// On the connection: each commits on its own.
	if err := s.TakeIn(ctx, conn, "sku", 1); err != nil {
		t.Fatal(err)
	}
	if err := a.DebitIn(ctx, conn, "alice", 10); err != nil {
		t.Fatal(err)
	}
	if err := a.CreditIn(ctx, conn, "alice", 3); err != nil {
		t.Fatal(err)
	}
	if err := s.TakeIn(ctx, conn, "sku", 100); !errors.Is(err, conditional.ErrSoldOut) {
		t.Fatalf("TakeIn of more than there is, on a conn: %v; want ErrSoldOut", err)
	}
	check("on a *pgx.Conn", 9, 93)
	// In a transaction, rolled back, then committed.
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.TakeIn(ctx, tx, "sku", 4); err != nil {
			t.Fatal(err)
		}
		if err := a.DebitIn(ctx, tx, "alice", 50); err != nil {
			t.Fatal(err)
		}
		if err := a.CreditIn(ctx, tx, "alice", 7); err != nil {
			t.Fatal(err)
		}
		if err := a.DebitIn(ctx, tx, "alice", 1000); !errors.Is(err, conditional.ErrInsufficient) {
			t.Fatalf("DebitIn of more than the balance, in a tx: %v; want ErrInsufficient", err)
		}
		if !commit {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			check("after a rollback", 9, 93)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		check("after a commit", 5, 50)
	}
}

// A Holds on a *pgx.Conn holds and confirms, each call committing on its
// own; Fenced.Update on a *pgx.Conn commits, in a pgx.Tx it is applied in
// it, and a rollback leaves the row as it was.
func TestHoldsAndFencedOnAConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, conn, _ := handles(t)
	h := newHolds(t, conn)
	t.Cleanup(func() { _ = h.Close() })
	if err := h.Add(ctx, "seat-1", "seat-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat-1", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat-1", "bob", time.Minute); !errors.Is(err, conditional.ErrHeld) {
		t.Fatalf("a second holder on a conn: %v; want ErrHeld", err)
	}
	if err := h.Confirm(ctx, "seat-1", "alice"); err != nil {
		t.Fatal(err)
	}
	if r := readHold(t, pool, "seat-1"); r.State != "confirmed" || r.Holder != "alice" {
		t.Fatalf("seat-1 read through the pool: %+v; want confirmed by alice", r)
	}

	f := newDocuments(t, pool)
	if err := f.Update(ctx, conn, 1, 5, map[string]any{"body": "v5"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, conn, 1, 4, map[string]any{"body": "v4"}); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("an older token on a conn: %v; want ErrFenced", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, tx, 1, 6, map[string]any{"body": "v6"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if d := readDocument(t, pool, 1); d.Body != "v5" || d.Fence != 5 {
		t.Fatalf("after a rolled-back update: %+v; want v5 at fence 5", d)
	}
}

// TakeIn on a *pgx.Conn waits for its commit whatever its ctx does: a take
// blocked on the row, whose ctx ends meanwhile, returns its own outcome
// once the row is free, and leaves the connection free.
func TestTakeInOnAConnWaitsForItsCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, conn, _ := handles(t)
	s := newStock(t, pool)
	if err := s.Put(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT qty FROM nolock_stock WHERE key = 'sku' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	takeCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.TakeIn(takeCtx, conn, "sku", 1) }()
	for waiting := false; !waiting; { // the take waits for the holder's row lock
		if err := pool.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("TakeIn whose ctx ended while its statement waited: %v; want its outcome, nil", err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("the connection after TakeIn returned: %v", err)
	}
	if got := available(t, s, "sku"); got != 4 {
		t.Fatalf("stock %d, want 4", got)
	}
}
