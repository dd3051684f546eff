package conditional_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// A key stocked by a Stock with 2 buckets and taken by one with 4: every
// take the stock covers is granted (a take that draws a bucket without a
// row goes across the key's buckets), then ErrSoldOut; a key never
// stocked is ErrNotFound.
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
	if err := s4.Take(ctx, "nope", 1); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("take of an unknown key: %v, want ErrNotFound", err)
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
	if err := a4.Credit(ctx, "nobody", 1); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("credit to an account never opened: %v, want ErrNotFound", err)
	}
}
