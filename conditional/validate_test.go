package conditional_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Names that are not valid UTF-8 are refused before any I/O, with
// ErrInvalid: PostgreSQL would refuse them only after the round trip
// (22021). Package dynamoconditional checks the same on DynamoDB.
func TestInvalidUTF8NamesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStock(t, testenv.Postgres(t))
	if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, conditional.ErrInvalid) {
		t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
	}
}

// A write whose ctx ended before the call sends nothing, and says so: it
// returns ctx's error, never ErrAmbiguousCommit. Package dynamoconditional
// checks the same on DynamoDB.
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
}
