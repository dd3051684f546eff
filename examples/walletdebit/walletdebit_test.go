package walletdebit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/examples/walletdebit"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test database, via Store.Do and
// Store.Exec, directly and behind PgBouncer (see
// testenv.ExampleDeployments), and its own checks (which return an error
// when an invariant breaks) pass.
func TestRun(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		for _, via := range []string{"do", "exec"} {
			t.Run(d.Name+"/"+via, func(t *testing.T) {
				t.Parallel() // each deployment has its own schema, topics and tables
				// An attempt cut short closes its connection; behind a
				// pooler each new one costs a login, so there attempts
				// get more room to finish (testenv.Scale: more under
				// -race), or cut attempts feed on each other.
				cut := 5 * time.Millisecond
				if strings.HasPrefix(d.Name, "pgbouncer") {
					cut = testenv.Scale(10 * time.Millisecond)
				}
				var out strings.Builder
				rep, err := walletdebit.Run(context.Background(), walletdebit.Config{
					DSN: d.DSN(t), Wallets: 3, Opening: 4000, Payments: 100, Deliveries: 3, Clients: 8, Via: via, Cut: cut, Out: &out,
				})
				t.Log("\n" + out.String())
				if err != nil {
					t.Fatal(err)
				}
				if rep.Paid+rep.Declined != 100 || rep.LedgerRows != rep.Paid || rep.Declined == 0 {
					t.Fatalf("report %+v: want 100 payments, some declined, one ledger row per paid one", rep)
				}
			})
		}
	}
}
