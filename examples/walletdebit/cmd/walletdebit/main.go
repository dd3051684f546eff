// Command walletdebit runs package walletdebit's story: payments debited
// from wallets with idempotency keys, each delivered several times at
// once and retried through timeouts and lost replies; it exits non-zero
// unless every payment was applied once and every balance adds up.
//
//	go run ./examples/walletdebit/cmd/walletdebit [-postgres postgres://…] [-wallets 5] [-opening 10000] [-payments 300] [-deliveries 3] [-clients 8] [-via do|exec] [-cut 5ms]
//
// The DSN defaults to $NOLOCK_TEST_POSTGRES (see scripts/services).
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"time"

	"github.com/nolock/nolock/examples/walletdebit"
)

func main() {
	dsn := flag.String("postgres", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	wallets := flag.Int("wallets", 5, "wallets")
	opening := flag.Int64("opening", 10_000, "each wallet's opening balance, in paise")
	payments := flag.Int("payments", 300, "payments")
	deliveries := flag.Int("deliveries", 3, "concurrent deliveries of each payment")
	clients := flag.Int("clients", 8, "payments in flight at once")
	via := flag.String("via", "do", "do: Store.Do with a ledger row; exec: Store.Exec, one statement")
	cut := flag.Duration("cut", 5*time.Millisecond, "shortest attempt timeout (attempts time out after cut to cut+100ms)")
	flag.Parse()
	if *dsn == "" {
		log.Fatal(`no -postgres and no NOLOCK_TEST_POSTGRES: run scripts/services up, then eval "$(scripts/services env)"`)
	}
	_, err := walletdebit.Run(context.Background(), walletdebit.Config{
		DSN: *dsn, Wallets: *wallets, Opening: *opening, Payments: *payments, Deliveries: *deliveries, Clients: *clients, Via: *via, Cut: *cut, Out: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
}
