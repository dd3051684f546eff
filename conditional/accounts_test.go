package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

func newAccounts(t *testing.T, pool *pgxpool.Pool, opts ...conditional.Option) *conditional.Accounts {
	t.Helper()
	a, err := conditional.NewAccounts(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

func balance(t *testing.T, a *conditional.Accounts, account string) int64 {
	t.Helper()
	n, err := a.Balance(context.Background(), account)
	if err != nil {
		t.Fatalf("Balance(%q): %v", account, err)
	}
	return n
}

func TestAccountsDebitCredit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a := newAccounts(t, pool)
	if err := a.Open(ctx, "alice", 1000); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "shop", 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "alice", 5); err != nil || balance(t, a, "alice") != 1000 {
		t.Fatalf("re-opening an account: %v, balance %d; want it left at 1000", err, balance(t, a, "alice"))
	}
	if err := a.Debit(ctx, "alice", 600); err != nil {
		t.Fatalf("debit 600 of 1000: %v", err)
	}
	if err := a.Debit(ctx, "alice", 500); !errors.Is(err, conditional.ErrInsufficient) {
		t.Fatalf("debit 500 of 400: %v, want ErrInsufficient", err)
	}
	if err := a.Credit(ctx, "shop", 600); err != nil {
		t.Fatal(err)
	}
	if got, want := [2]int64{balance(t, a, "alice"), balance(t, a, "shop")}, [2]int64{400, 600}; got != want {
		t.Fatalf("balances %v, want %v", got, want)
	}
	// Inside the caller's transaction too: a debit the balance cannot cover
	// is refused, and nothing is taken.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return a.DebitIn(ctx, tx, "alice", 401) })
	if !errors.Is(err, conditional.ErrInsufficient) || balance(t, a, "alice") != 400 {
		t.Fatalf("DebitIn 401 of 400: %v, balance %d; want ErrInsufficient and 400", err, balance(t, a, "alice"))
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return a.DebitIn(ctx, tx, "alice", 400) }); err != nil || balance(t, a, "alice") != 0 {
		t.Fatalf("DebitIn of the whole balance: %v, balance %d", err, balance(t, a, "alice"))
	}
	if err := a.Credit(ctx, "alice", 400); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "bob", 1); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("debit of an unknown account: %v, want ErrNotFound", err)
	}
	if err := a.Credit(ctx, "bob", 1); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("credit of an unknown account: %v, want ErrNotFound", err)
	}
	var cols string
	err = pool.QueryRow(ctx, `SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_name = 'nolock_accounts' AND table_schema = current_schema()`).Scan(&cols)
	if err != nil || cols != "key,bucket,balance" {
		t.Fatalf("accounts table columns %q (%v), want key,bucket,balance", cols, err)
	}
}

func TestAccountsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newAccounts(t, testenv.Postgres(t))
	if err := a.Open(ctx, "alice", 100); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, want string
		err        error
	}{
		{"debit zero", "amount must be positive", a.Debit(ctx, "alice", 0)},
		{"debit negative", "amount must be positive", a.Debit(ctx, "alice", -5)},
		{"credit negative", "amount must be positive", a.Credit(ctx, "alice", -5)},
		{"debit empty account", "account is empty", a.Debit(ctx, "", 5)},
		{"credit empty account", "account is empty", a.Credit(ctx, "", 5)},
		{"open negative", "balance must not be negative", a.Open(ctx, "alice", -1)},
		{"debit in nil tx", "tx is nil", a.DebitIn(ctx, nil, "alice", 5)},
		{"credit in nil tx", "tx is nil", a.CreditIn(ctx, nil, "alice", 5)},
	} {
		if !errors.Is(tc.err, conditional.ErrInvalid) || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid naming %q", tc.name, tc.err, tc.want)
		}
	}
	if got := balance(t, a, "alice"); got != 100 {
		t.Fatalf("bad input changed the balance: %d, want 100", got)
	}
}

// A hot account: debits of random sizes and credits race on it. Whatever
// the interleaving, opening + credited − debited == final, and the balance
// never goes below zero (the CHECK would fail the statement).
func TestAccountsHotAccountConservesMoney(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 4} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			a := newAccounts(t, testenv.Postgres(t), conditional.WithBuckets(buckets))
			const opening = 50_000
			if err := a.Open(ctx, "merchant", opening); err != nil {
				t.Fatal(err)
			}
			var debited, credited, refused atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for w := 0; w < 32; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 150; i++ {
						amount := rand.Int64N(500) + 1
						if w%4 == 0 {
							if err := a.Credit(ctx, "merchant", amount); err != nil {
								errs <- err
								return
							}
							credited.Add(amount)
							continue
						}
						switch err := a.Debit(ctx, "merchant", amount); {
						case err == nil:
							debited.Add(amount)
						case errors.Is(err, conditional.ErrInsufficient):
							refused.Add(1)
						default:
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			final := balance(t, a, "merchant")
			if final != opening+credited.Load()-debited.Load() || final < 0 {
				t.Fatalf("opening %d + credited %d - debited %d = %d, but the balance is %d",
					opening, credited.Load(), debited.Load(), opening+credited.Load()-debited.Load(), final)
			}
			if refused.Load() == 0 {
				t.Fatalf("no debit was refused: the test did not reach the limit (final %d)", final)
			}
		})
	}
}

// The seed's wallet: in one transaction, debit the wallet and insert a
// ledger entry keyed by the payment's idempotency key. Concurrent retries of
// the same payments debit each key exactly once.
func TestAccountsDebitInWithLedgerKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a := newAccounts(t, pool, conditional.WithBuckets(2))
	mustExec(t, pool, `CREATE TABLE ledger (payment text PRIMARY KEY, amount bigint NOT NULL)`)
	if err := a.Open(ctx, "wallet", 10_000); err != nil {
		t.Fatal(err)
	}
	const payments, attempts, amount = 8, 6, 500
	var wg sync.WaitGroup
	errs := make(chan error, payments*attempts)
	for p := 0; p < payments; p++ {
		for r := 0; r < attempts; r++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					tag, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2) ON CONFLICT DO NOTHING`, fmt.Sprint("pay-", p), amount)
					if err != nil || tag.RowsAffected() == 0 {
						return err // a retry of a payment already made: nothing to do
					}
					return a.DebitIn(ctx, tx, "wallet", amount)
				})
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var rows, sum int64
	if err := pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM ledger`).Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if got := balance(t, a, "wallet"); rows != payments || got != 10_000-sum || sum != payments*amount {
		t.Fatalf("ledger rows %d (sum %d), balance %d; want %d rows and balance %d", rows, sum, got, payments, 10_000-payments*amount)
	}

	// A debit in a transaction that rolls back leaves the balance alone,
	// even when it had to take across buckets (a savepoint in the caller's tx).
	before := balance(t, a, "wallet")
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := a.DebitIn(ctx, tx, "wallet", before); err != nil {
			return fmt.Errorf("debit of the whole balance: %w", err)
		}
		return errors.New("roll back")
	})
	if err == nil || err.Error() != "roll back" {
		t.Fatalf("transaction: %v", err)
	}
	if got := balance(t, a, "wallet"); got != before {
		t.Fatalf("balance %d after a rolled-back debit, want %d", got, before)
	}
}

// A batch whose amounts add up past int64 is still exact: debits of 2^62
// queued with a debit of 1 against a balance of 10 are refused, not
// granted by a wrapped sum; of credits of 2^62 only the one that fits the
// column lands.
func TestAccountsBatchPastInt64IsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	a, err := conditional.NewAccounts(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "acct", 10); err != nil {
		t.Fatal(err)
	}
	// queue sends a 1 and then amounts through op while a transaction
	// holds the account's row, so the amounts go out as one batch.
	queue := func(op func(context.Context, string, int64) error, amounts ...int64) []error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `SELECT 1 FROM nolock_accounts WHERE key = 'acct' FOR UPDATE`); err != nil {
			t.Fatal(err)
		}
		return batchBehind(t, pool, func() { tx.Rollback(ctx) }, func(n int64) error { return op(ctx, "acct", n) }, append([]int64{1}, amounts...)...)
	}
	const huge = int64(1) << 62
	errs := queue(a.Debit, 1, huge, huge, huge)
	for i, want := range []error{nil, nil, conditional.ErrInsufficient, conditional.ErrInsufficient, conditional.ErrInsufficient} {
		if (want == nil) != (errs[i] == nil) || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("debit %d: %v, want %v", i, errs[i], want)
		}
	}
	if b := balance(t, a, "acct"); b != 8 {
		t.Fatalf("balance %d after debits of 1 and 1 (and three refused of 2^62), want 8", b)
	}
	errs = queue(a.Credit, huge, huge, huge)
	landed := 0
	for _, err := range errs[1:] {
		if err == nil {
			landed++
		}
	}
	if errs[0] != nil || landed != 1 {
		t.Fatalf("credits: %v; want the credit of 1 and exactly one of 2^62 to land", errs)
	}
	if b := balance(t, a, "acct"); b != 9+huge {
		t.Fatalf("balance %d, want %d", b, 9+huge)
	}
}

// Balance 11, a credit of 1, then a coalesced batch of credits
// [MaxInt64-30, 25] whose sum fits int64 but takes the row past it: the
// first two land, and the one that would overflow is refused with an
// error saying so, not with a raw "bigint out of range" for the batch.
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
	errs := batchBehind(t, pool, func() { tx.Rollback(ctx) }, credit, 1, math.MaxInt64-30, 25)
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
