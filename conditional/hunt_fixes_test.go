package conditional_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// TestInvalidUTF8NamesRefused: DynamoDB's JSON encoder writes each invalid
// byte as U+FFFD, so "sku-\xff" and "sku-\xfe" addressed one item and a
// take of one key sold the other's units; a hold by one holder was
// confirmed by another. Such names are refused before any I/O, on
// PostgreSQL too (which refused them only after the round trip, 22021).
func TestInvalidUTF8NamesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		s := newStock(t, testenv.Postgres(t))
		if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, conditional.ErrInvalid) {
			t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
		}
	})
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			t.Run("stock", func(t *testing.T) {
				table := testenv.Table(t, client, false)
				s := newDynamoStock(t, client, table, 1)
				if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
				}
				if err := s.Take(ctx, "sku-\xfe", 3); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Take of a non-UTF-8 key: %v, want ErrInvalid", err)
				}
				if items := dynamoItems(t, client, table); len(items) != 0 {
					t.Fatalf("items written: %v", items)
				}
			})
			t.Run("holds", func(t *testing.T) {
				table := testenv.Table(t, client, false)
				h := newDynamoHolds(t, client, table, newHoldClock().now)
				if err := h.Add(ctx, "seat"); err != nil {
					t.Fatal(err)
				}
				before := dynamoItems(t, client, table)
				if _, err := h.Hold(ctx, "seat", "holder-\xff", time.Minute); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Hold by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if err := h.Confirm(ctx, "seat", "holder-\xfe"); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Confirm by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if after := dynamoItems(t, client, table); !slices.Equal(before, after) {
					t.Fatalf("items changed: %v, then %v", before, after)
				}
			})
		})
	}
}

// TestStockSoldOutCacheIgnoresCallerTx: a TakeIn that saw a key empty inside
// a caller's transaction marked it sold out, so after the transaction
// rolled back (the units back) every Take in the process answered
// ErrSoldOut for the cache's TTL. Reads in a caller's transaction no longer
// mark; with buckets the take across them is covered too.
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

// TestAccountsCreditInClearsSoldOutCache: a committed CreditIn left the
// mark of an earlier empty Debit, so Debit answered ErrInsufficient for the
// cache's TTL though the balance covered it.
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

// TestStockBucketCountMismatch: a key stocked by a 2-bucket Stock and taken
// by a 4-bucket one failed about half its takes with ErrUnknownKey (a random
// bucket without a row) while units were available. Such a take now goes
// across the key's buckets.
func TestStockBucketCountMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s2 := newStock(t, pool, conditional.WithBuckets(2))
	s4 := newStock(t, pool, conditional.WithBuckets(4))
	if err := s2.Put(ctx, "sku", 40); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if err := s4.Take(ctx, "sku", 1); err != nil {
			t.Fatalf("take %d of 40: %v", i+1, err)
		}
	}
	if err := s4.Take(ctx, "sku", 1); !errors.Is(err, conditional.ErrSoldOut) {
		t.Fatalf("take from empty: %v, want ErrSoldOut", err)
	}
	if err := s4.Take(ctx, "nope", 1); !errors.Is(err, conditional.ErrUnknownKey) {
		t.Fatalf("take of an unknown key: %v, want ErrUnknownKey", err)
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

// TestStockPutBeatsOlderSoldOutMark: a take read 0, a Put committed and
// cleared the cache, then the take marked the key sold out, so Take was
// refused for the cache's TTL after Put returned. A take now marks only if
// no restock happened in this process since it read the stock.
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

// TestAccountsCoalescedCreditsPastMaxInt64: balance 12 and a batch of
// credits [MaxInt64-30, 25] whose sum fits int64 but takes the row past it:
// both failed with a raw "bigint out of range" though the first alone fits.
// The batch now falls back to one statement per credit, and the one that
// overflows is refused with an error saying so.
func TestAccountsCoalescedCreditsPastMaxInt64(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a := newAccounts(t, pool)
	if err := a.Open(ctx, "merchant", 11); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "SELECT 1 FROM nolock_accounts WHERE key = 'merchant' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	credit := func(n int64) error { return a.Credit(ctx, "merchant", n) }
	errs := batchBehind(func() { tx.Rollback(ctx) }, credit, 1, math.MaxInt64-30, 25)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("credits of 1 and MaxInt64-30 to 11: %v, %v; want nil, nil", errs[0], errs[1])
	}
	if err := errs[2]; err == nil || !strings.Contains(err.Error(), "would exceed") {
		t.Fatalf("credit of 25 to MaxInt64-18: %v, want an error naming the overflow (balance %d)", err, balance(t, a, "merchant"))
	}
	if got := balance(t, a, "merchant"); got != math.MaxInt64-18 {
		t.Fatalf("balance %d, want MaxInt64-18", got)
	}
}

// TestCancelledBeforeCallSendsNothing: a ctx cancelled before the call was
// reported ErrAmbiguousCommit (Stock.Put, DynamoStock.Take) though nothing
// had been sent. Writes now check ctx first and return its error.
func TestCancelledBeforeCallSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) || errors.Is(err, conditional.ErrAmbiguousCommit) {
			t.Errorf("%s with a cancelled ctx: %v, want context.Canceled and not ErrAmbiguousCommit", what, err)
		}
	}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		s := newStock(t, pool)
		if err := s.Put(ctx, "sku", 5); err != nil {
			t.Fatal(err)
		}
		check(t, "Stock.Put", s.Put(cancelled, "sku", 1))
		check(t, "Stock.Take", s.Take(cancelled, "sku", 1))
		if got := available(t, s, "sku"); got != 5 {
			t.Fatalf("available %d, want 5", got)
		}
		a := newAccounts(t, pool)
		if err := a.Open(ctx, "alice", 5); err != nil {
			t.Fatal(err)
		}
		check(t, "Accounts.Credit", a.Credit(cancelled, "alice", 1))
		check(t, "Accounts.Debit", a.Debit(cancelled, "alice", 1))
		if got := balance(t, a, "alice"); got != 5 {
			t.Fatalf("balance %d, want 5", got)
		}
	})
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			s := newDynamoStock(t, client, table, 1)
			if err := s.Put(ctx, "sku", 5); err != nil {
				t.Fatal(err)
			}
			check(t, "DynamoStock.Take", s.Take(cancelled, "sku", 1))
			check(t, "DynamoStock.Put", s.Put(cancelled, "sku", 1))
			if got := dynamoAvailable(t, s, "sku"); got != 5 {
				t.Fatalf("available %d, want 5", got)
			}
		})
	}
}

// Accounts with more buckets than an account was opened with neither
// mint money on a retried Open (bucket 0 decides whether the account
// exists) nor refuse its credits as unknown.
func TestAccountsBucketCountMismatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a1 := newAccounts(t, pool)
	a4 := newAccounts(t, pool, conditional.WithBuckets(4))
	if err := a1.Open(ctx, "alice", 100); err != nil {
		t.Fatal(err)
	}
	if err := a4.Open(ctx, "alice", 100); err != nil {
		t.Fatal(err)
	}
	if got := balance(t, a1, "alice"); got != 100 {
		t.Fatalf("balance after a second Open with 4 buckets: %d, want 100 (unchanged)", got)
	}
	for i := 0; i < 20; i++ {
		if err := a4.Credit(ctx, "alice", 1); err != nil {
			t.Fatalf("credit %d through 4 buckets to an account with 1: %v", i, err)
		}
	}
	if got := balance(t, a1, "alice"); got != 120 {
		t.Fatalf("balance %d, want 120", got)
	}
	if err := a4.Credit(ctx, "nobody", 1); !errors.Is(err, conditional.ErrUnknownKey) {
		t.Fatalf("credit to an account never opened: %v, want ErrUnknownKey", err)
	}
}

// A DynamoFenced key that is not valid UTF-8 is refused before I/O: the
// SDK would send it as another item's key (each invalid byte as U+FFFD).
func TestDynamoFencedRefusesNonUTF8Key(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	err := f.Update(ctx, client, dynamoDocKey("doc-\xff"), 7, dynamoBody("x"))
	if !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("fenced Update of a non-UTF-8 key: %v, want ErrInvalid naming UTF-8", err)
	}
}
