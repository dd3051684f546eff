package conditional

import (
	"context"
	"fmt"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgarg"
)

// Accounts holds balances in a PostgreSQL table and debits them only when
// they cover the amount: "UPDATE … SET balance = balance - $a WHERE key =
// $k AND bucket = $b AND balance >= $a" (one row per account and bucket;
// bucket 0 unless WithBuckets). No lock service, no read-modify-write;
// the row decides, and under Read Committed a debit blocked on the row
// re-checks the balance it finally sees.
//
// Amounts are integers in the currency's minor unit (cents, paise). A hot
// account gets the same treatment as a hot Stock key: concurrent debits of
// one account in this process are coalesced into one statement (first fit
// in arrival order), and so are concurrent credits (a merchant receiving
// many payments), one commit per batch. DebitIn and CreditIn run inside the
// caller's transaction instead, so an idempotency key, a ledger row or an
// order can commit with the debit, all or nothing.
//
// NewAccounts takes every setter NewStock takes (see Option); its table
// defaults to "nolock_accounts", with the amount in a column named
// balance. An Accounts is safe for concurrent use; Close it to
// stop its goroutines.
type Accounts struct {
	s *Stock
}

// DefaultAccountsTable is the accounts table's name unless WithTable says
// otherwise.
const DefaultAccountsTable = "nolock_accounts"

// NewAccounts returns Accounts on db, a *pgxpool.Pool: a *pgx.Conn or a
// pgx.Tx is refused with ErrInvalid (see DB; DebitIn and CreditIn take
// them per call). Run its
// CreateSchema (or put its Schema in your migrations) first.
func NewAccounts(db DB, opts ...Option) (*Accounts, error) {
	cfg := stockDefaults(config{table: DefaultAccountsTable, column: "balance", keyArg: "account", amountArg: "amount"})
	if err := apply(&cfg, opts, "NewAccounts", stockSetters); err != nil {
		return nil, err
	}
	s, err := newStock(db, cfg)
	if err != nil {
		return nil, err
	}
	s.outcome = condcore.Debit
	return &Accounts{s}, nil
}

// Open creates account with an opening balance (which may be 0) if it does
// not exist. An account that exists is left as it is, its balance
// unchanged, and Open returns nil: so Open is idempotent, and safe to retry
// after ErrAmbiguousCommit. Use Credit to add to a balance.
func (a *Accounts) Open(ctx context.Context, account string, balance int64) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArg("account", account); err != nil {
		return err
	}
	if balance < 0 {
		return condcore.Invalid("balance must not be negative, got %d", balance)
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("open %q", account)); err != nil {
		return err
	}
	if _, err := a.s.pg.Exec(ctx, a.s.db, a.s.openSQL, a.s.over.Args(account, balance, int64(a.s.buckets))...); err != nil {
		return errfmt.Errorf("conditional: open %q: %w", account, classify(err))
	}
	return nil
}

// Debit takes amount from account if its balance covers it: nil means it
// was taken; ErrInsufficient means nothing was taken; ErrNotFound means no
// such account; ErrAmbiguousCommit means the debit may have committed: the
// connection failed after the statement was sent, or the wait for it ended
// first (read the balance, or use an idempotency key, before retrying).
// Cancelling ctx withdraws a debit not yet sent; one sent is waited for as
// Take's is.
func (a *Accounts) Debit(ctx context.Context, account string, amount int64) error {
	return a.s.Take(ctx, account, amount)
}

// DebitIn is Debit inside the caller's transaction tx, not coalesced: it
// commits or rolls back with tx, and never reports ErrAmbiguousCommit (the
// caller's COMMIT decides). tx may also be a pool or a *pgx.Conn, where
// the debit commits on its own (see DB).
func (a *Accounts) DebitIn(ctx context.Context, tx DB, account string, amount int64) error {
	return a.s.TakeIn(ctx, tx, account, amount)
}

// Credit adds amount to an existing account (ErrNotFound otherwise).
// Concurrent credits of one account are coalesced into one statement; if
// their sum would take the balance past MaxInt64, each is applied alone. A
// credit that alone would take the balance past MaxInt64 is refused with an
// error saying so (wrapping PostgreSQL's 22003); nothing is added.
func (a *Accounts) Credit(ctx context.Context, account string, amount int64) error {
	return a.s.add(ctx, nil, account, amount)
}

// CreditIn is Credit inside the caller's transaction tx, not coalesced: it
// commits or rolls back with tx. tx may also be a pool or a *pgx.Conn,
// where the credit commits on its own (see DB).
func (a *Accounts) CreditIn(ctx context.Context, tx DB, account string, amount int64) error {
	if pgarg.NilDB(tx) {
		return condcore.Invalid("tx is nil")
	}
	return a.s.add(ctx, tx, account, amount)
}

// Balance returns account's balance: a snapshot, which concurrent debits
// and credits may change at once.
func (a *Accounts) Balance(ctx context.Context, account string) (int64, error) {
	return a.s.Available(ctx, account)
}

// Schema returns the DDL of the accounts table, for migration tools.
func (a *Accounts) Schema() string { return a.s.Schema() }

// CreateSchema creates the accounts table if it does not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (a *Accounts) CreateSchema(ctx context.Context) error { return a.s.CreateSchema(ctx) }

// Close fails debits and credits not yet sent with ErrClosed and waits for
// those in flight. It is idempotent.
func (a *Accounts) Close() error { return a.s.Close() }
