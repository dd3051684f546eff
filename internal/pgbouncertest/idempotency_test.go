package pgbouncertest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
)

// idempotencyScenario: Do and Exec, their replays, mismatches and
// refusals stored as outcomes, Get and Reap.
var idempotencyScenario = scenario{"idempotency.Store", func(ctx context.Context, b *bed, w string) error {
	acct := w + "-wallet"
	if _, err := b.admin.Exec(ctx, `INSERT INTO wallets VALUES ($1, 10)`, acct); err != nil {
		return err
	}
	debit := func(tx pgx.Tx, amount int64) ([]byte, error) {
		var left int64
		err := tx.QueryRow(ctx, `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2 RETURNING balance`, acct, amount).Scan(&left)
		if errors.Is(err, pgx.ErrNoRows) {
			return []byte("declined"), idempotency.Terminal(errors.New("insufficient"))
		}
		return fmt.Appendf(nil, "%d", left), err
	}
	do := func(key string, fp string, amount int64) (idempotency.Result, error) {
		return b.idem.Do(ctx, "do", acct+key, []byte(fp), func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return debit(tx, amount) })
	}
	const debitSQL = `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2 RETURNING balance`
	exec := func(key string, fp string, amount int64) (idempotency.Result, error) {
		return b.idem.Exec(ctx, "exec", acct+key, []byte(fp), debitSQL, acct, amount)
	}
	for _, c := range []struct {
		step     string
		call     func(string, string, int64) (idempotency.Result, error)
		key, fp  string
		amount   int64
		body     string
		replayed bool
		err      error
	}{
		{"Do", do, "-1", "a", 3, "7", false, nil},
		{"Do again (a replay)", do, "-1", "a", 3, "7", true, nil},
		{"Do with another request", do, "-1", "b", 3, "", false, idempotency.ErrMismatch},
		{"Exec", exec, "-2", "a", 4, `[{"balance":3}]`, false, nil},
		{"Exec again (a replay)", exec, "-2", "a", 4, `[{"balance":3}]`, true, nil},
		{"Exec with another request", exec, "-2", "b", 4, "", false, idempotency.ErrMismatch},
		{"Exec past the balance (stored as refused)", exec, "-3", "a", 5, "[]", false, nil},
		{"Do past the balance (stored as refused)", do, "-4", "a", 5, "declined", false, nil},
	} {
		res, err := c.call(c.key, c.fp, c.amount)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				return fmt.Errorf("%s: %v, want %v", c.step, err, c.err)
			}
			continue
		}
		if err != nil || string(res.Body) != c.body || res.Replayed != c.replayed {
			return fmt.Errorf("%s: %q replayed=%v, %v; want %q replayed=%v", c.step, res.Body, res.Replayed, err, c.body, c.replayed)
		}
	}
	if rec, err := b.idem.Get(ctx, "exec", acct+"-2"); err != nil || string(rec.Body) != `[{"balance":3}]` {
		return fmt.Errorf("Get: %+v, %v", rec, err)
	}
	if _, err := b.idem.Reap(ctx, 100); err != nil {
		return fmt.Errorf("Reap: %v", err)
	}
	var left int64
	if err := b.admin.QueryRow(ctx, `SELECT balance FROM wallets WHERE account = $1`, acct).Scan(&left); err != nil || left != 3 {
		return fmt.Errorf("the wallet: %d, %v; want 3 (two debits ran once each)", left, err)
	}
	return nil
}}
