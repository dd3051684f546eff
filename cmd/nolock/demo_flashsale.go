package main

import (
	"context"
	"fmt"

	"github.com/nolock/nolock/examples/flashsale"
)

// flashSale runs examples/flashsale's story on the demo's database: one
// row per way to sell.
func flashSale(ctx context.Context, env *demoEnv) ([]row, error) {
	rep, err := flashsale.Run(ctx, flashsale.Config{DSN: env.dsn, Units: 300, Buyers: 5000, InFlight: 256, Buckets: 16, Conns: 40, Out: env.out, Observer: env.obs})
	if err != nil {
		return nil, err
	}
	var rows []row
	for _, s := range rep.Sales {
		rows = append(rows, row{what: s.Strategy,
			outcome: fmt.Sprintf("sold %d/%d, oversold %d, %.0f buyers/s", s.Sold, s.Units, s.Oversold(), s.Rate()),
			ok:      s.Exact()})
	}
	return rows, nil
}
