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

// A TakeIn that finds a key empty inside a caller's transaction does not
// mark it sold out: the transaction may roll back and return the units,
// and a Take must then be granted them, with one bucket or several.
func TestStockSoldOutCacheIgnoresCallerTx(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 2} {
		t.Run(map[int]string{1: "one bucket", 2: "two buckets"}[buckets], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.Postgres(t)
			s := newStock(t, pool, conditional.WithBuckets(buckets), conditional.WithSoldOutCache(time.Hour))
			if err := s.Put(ctx, "sku", 4); err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.TakeIn(ctx, tx, "sku", 4); err != nil {
				t.Fatalf("TakeIn the last 4: %v", err)
			}
			if err := s.TakeIn(ctx, tx, "sku", 1); !errors.Is(err, conditional.ErrSoldOut) {
				t.Fatalf("TakeIn from empty: %v, want ErrSoldOut", err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := s.Take(ctx, "sku", 1); err != nil {
				t.Fatalf("Take after the transaction rolled back: %v, want nil", err)
			}
		})
	}
}

// A committed CreditIn clears the sold-out mark of an earlier refused
// Debit: the next Debit the balance covers is granted at once, not
// refused for the cache's TTL.
func TestAccountsCreditInClearsSoldOutCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a := newAccounts(t, pool, conditional.WithSoldOutCache(time.Hour))
	if err := a.Open(ctx, "alice", 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 1); !errors.Is(err, conditional.ErrInsufficient) {
		t.Fatalf("Debit of an empty account: %v, want ErrInsufficient", err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return a.CreditIn(ctx, tx, "alice", 100)
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 1); err != nil {
		t.Fatalf("Debit after a committed CreditIn of 100: %v, want nil", err)
	}
	if got := balance(t, a, "alice"); got != 99 {
		t.Fatalf("balance %d, want 99", got)
	}
}

// pausingDB pauses a take's read of one bucket's quantity after the value
// arrived and before the take acts on it.
type pausingDB struct {
	*pgxpool.Pool
	paused, release chan struct{}
}

func (p *pausingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := p.Pool.QueryRow(ctx, sql, args...)
	if !strings.HasPrefix(sql, `SELECT "qty" FROM`) {
		return row
	}
	return pausedRow{row, p}
}

type pausedRow struct {
	pgx.Row
	p *pausingDB
}

func (r pausedRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.p.paused <- struct{}{}
	<-r.p.release
	return err
}

// A take that read 0 before a Put committed does not mark the key sold
// out after the Put cleared the cache: a take marks only if no restock
// happened in this process since it read the stock, so a Take after Put
// returns is granted.
func TestStockPutBeatsOlderSoldOutMark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	db := &pausingDB{Pool: pool, paused: make(chan struct{}), release: make(chan struct{})}
	s, err := conditional.NewStock(db, conditional.WithSoldOutCache(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "sku", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, "sku", 1); err != nil {
		t.Fatal(err)
	}
	took := make(chan error, 1)
	go func() { took <- s.Take(ctx, "sku", 1) }()
	<-db.paused // the take has read 0
	if err := s.Put(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	close(db.release)
	if err := <-took; !errors.Is(err, conditional.ErrSoldOut) {
		t.Fatalf("the paused take: %v, want ErrSoldOut", err)
	}
	if err := s.Take(ctx, "sku", 1); err != nil {
		t.Fatalf("Take after Put(5) returned: %v, want nil", err)
	}
}
