package flashsale_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nolock/nolock/examples/flashsale"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test database, directly and behind
// PgBouncer (see testenv.ExampleDeployments): conditional.Stock sells
// exactly the stock, coalesced and over buckets; the FOR UPDATE baseline
// is exact too, only slower.
func TestRun(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		t.Run(d.Name, func(t *testing.T) {
			var out strings.Builder
			rep, err := flashsale.Run(context.Background(), flashsale.Config{
				DSN: d.DSN(t), Units: 200, Buyers: 1000, InFlight: 128, Buckets: 4, Conns: 16, Out: &out,
			})
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Sales) != 4 || !rep.Sales[1].Exact() {
				t.Fatalf("sales %+v: want 4, the FOR UPDATE baseline exact", rep.Sales)
			}
		})
	}
}
