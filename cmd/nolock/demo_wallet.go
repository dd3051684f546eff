package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nolock/nolock/examples/walletdebit"
	"github.com/nolock/nolock/idempotency"
)

// wallet runs examples/walletdebit's story on the demo's database.
func wallet(ctx context.Context, env *demoEnv) ([]row, error) {
	const wallets, opening, payments = 5, 10_000, 400
	rep, err := walletdebit.Run(ctx, walletdebit.Config{DSN: env.dsn, Wallets: wallets, Opening: opening, Payments: payments, Deliveries: 3, Clients: 8,
		Via: "do", Cut: 5 * time.Millisecond, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	return []row{{what: "idempotency key + debit in one transaction",
		outcome: fmt.Sprintf("%d attempts (%d cut short, %d replies lost): %d paid once, %d declined; %d of %d balances = %d − paid",
			rep.Attempts, rep.CutShort, rep.Lost, rep.LedgerRows, rep.Declined, rep.Balanced, wallets, opening),
		ok: rep.Paid+rep.Declined == payments && rep.LedgerRows == rep.Paid && rep.Balanced == wallets && errors.Is(rep.KeyReuse, idempotency.ErrMismatch)}}, nil
}
