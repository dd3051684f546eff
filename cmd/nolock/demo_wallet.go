package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
)

// wallet debits payments with duplicate retries through idempotency keys:
// one debit and one ledger row per payment, balance == opening − the
// distinct payments, and the last payments the balance cannot cover are
// declined (a terminal outcome, replayed to every retry).
func wallet(ctx context.Context, env *demoEnv) ([]row, error) {
	const opening, payments, amount, retries = 180_000, 400, 500, 3 // 360 payments fit
	accounts, err := conditional.NewAccounts(env.pool)
	if err != nil {
		return nil, err
	}
	defer accounts.Close()
	keys, err := idempotency.New(env.pool)
	if err != nil {
		return nil, err
	}
	for _, create := range []func(context.Context) error{accounts.CreateSchema, keys.CreateSchema} {
		if err := create(ctx); err != nil {
			return nil, err
		}
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
	var ran, replayed, declined atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, len(attempts))
	sem := make(chan struct{}, 32)
	for _, p := range attempts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			payment := fmt.Sprint("pay-", p)
			res, err := keys.Do(ctx, "asha", payment, idempotency.Fingerprint([]byte(payment), fmt.Append(nil, amount)),
				func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					ran.Add(1)
					if err := accounts.DebitIn(ctx, tx, "asha", amount); errors.Is(err, conditional.ErrInsufficient) {
						return []byte("declined"), idempotency.Terminal(err) // stored: every retry gets the same answer
					} else if err != nil {
						return nil, err
					}
					_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2)`, payment, amount)
					return []byte("paid"), err
				})
			switch {
			case err != nil:
				errs <- err
			case res.Replayed:
				replayed.Add(1)
			}
			if err == nil && string(res.Body) == "declined" {
				declined.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	balance, err := accounts.Balance(ctx, "asha")
	if err != nil {
		return nil, err
	}
	var rows, sum int64
	if err := env.pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM ledger`).Scan(&rows, &sum); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   %d attempts for %d payments: %d ran, %d replayed; %d ledger rows, %d answers 'declined'; balance %d\n",
		len(attempts), payments, ran.Load(), replayed.Load(), rows, declined.Load(), balance)
	paidOnce := rows == opening/amount && balance == opening-sum && balance >= 0
	everyRetryAgrees := declined.Load() == (payments-rows)*retries
	return []row{{what: "idempotency key + debit in one transaction",
		outcome: fmt.Sprintf("%d attempts, %d paid once, %d declined, balance %d = %d − %d", len(attempts), rows, payments-rows, balance, opening, sum),
		ok:      paidOnce && everyRetryAgrees}}, nil
}
