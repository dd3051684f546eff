package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
)

// wallet debits payments with duplicate retries: one ledger row per
// payment key, balance == opening − the distinct payments.
func wallet(ctx context.Context, env *demoEnv) ([]row, error) {
	const opening, payments, amount, retries = 1_000_000, 400, 500, 3
	accounts, err := conditional.NewAccounts(env.pool)
	if err != nil {
		return nil, err
	}
	defer accounts.Close()
	if err := accounts.CreateSchema(ctx); err != nil {
		return nil, err
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE ledger (payment text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		return nil, err
	}
	if err := accounts.Open(ctx, "asha", opening); err != nil {
		return nil, err
	}
	// Every payment is sent retries times, concurrently and in random
	// order: a client that timed out and retried, a duplicate delivery.
	var attempts []int
	for p := 0; p < payments; p++ {
		for r := 0; r < retries; r++ {
			attempts = append(attempts, p)
		}
	}
	rand.Shuffle(len(attempts), func(i, j int) { attempts[i], attempts[j] = attempts[j], attempts[i] })
	var wg sync.WaitGroup
	errs := make(chan error, len(attempts))
	sem := make(chan struct{}, 64)
	for _, p := range attempts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs <- pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2) ON CONFLICT DO NOTHING`, fmt.Sprint("pay-", p), amount)
				if err != nil || tag.RowsAffected() == 0 {
					return err // a retry of a payment already made: nothing to do
				}
				return accounts.DebitIn(ctx, tx, "asha", amount)
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return nil, err
		}
	}
	balance, err := accounts.Balance(ctx, "asha")
	if err != nil {
		return nil, err
	}
	var rows int
	if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		return nil, err
	}
	want := int64(opening - payments*amount)
	fmt.Fprintf(env.out, "   %d payment attempts for %d payments: %d ledger rows, balance %d (want %d)\n",
		len(attempts), payments, rows, balance, want)
	return []row{{what: "debit + ledger key in one transaction",
		outcome: fmt.Sprintf("%d attempts, %d ledger rows, balance %d = %d − %d×%d", len(attempts), rows, balance, opening, payments, amount),
		ok:      rows == payments && balance == want}}, nil
}
