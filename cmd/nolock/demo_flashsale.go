package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
)

// flashSale sells units to buyers four ways and counts what each sold.
func flashSale(ctx context.Context, env *demoEnv) ([]row, error) {
	const buyers, units = 5000, 300
	if _, err := env.pool.Exec(ctx, `CREATE TABLE sale (sku text PRIMARY KEY, qty int NOT NULL)`); err != nil {
		return nil, err
	}
	stock, err := conditional.NewStock(env.pool)
	if err != nil {
		return nil, err
	}
	defer stock.Close()
	buckets, err := conditional.NewStock(env.pool, conditional.WithBuckets(16))
	if err != nil {
		return nil, err
	}
	defer buckets.Close()
	if err := stock.CreateSchema(ctx); err != nil {
		return nil, err
	}

	type strategy struct {
		what     string
		baseline bool
		setup    func(sku string) error
		buy      func(ctx context.Context, sku string) (bool, error)
		left     func(sku string) (int64, error)
	}
	plain := func(sku string) error {
		_, err := env.pool.Exec(ctx, `INSERT INTO sale VALUES ($1, $2)`, sku, units)
		return err
	}
	plainLeft := func(sku string) (int64, error) {
		var n int64
		err := env.pool.QueryRow(ctx, `SELECT qty FROM sale WHERE sku = $1`, sku).Scan(&n)
		return n, err
	}
	take := func(s *conditional.Stock) func(context.Context, string) (bool, error) {
		return func(ctx context.Context, sku string) (bool, error) {
			err := s.Take(ctx, sku, 1)
			if errors.Is(err, conditional.ErrSoldOut) {
				return false, nil
			}
			return err == nil, err
		}
	}
	strategies := []strategy{
		{"baseline: read, then write (no lock)", true, plain, func(ctx context.Context, sku string) (bool, error) {
			var qty int
			if err := env.pool.QueryRow(ctx, `SELECT qty FROM sale WHERE sku = $1`, sku).Scan(&qty); err != nil || qty <= 0 {
				return false, err
			}
			_, err := env.pool.Exec(ctx, `UPDATE sale SET qty = $2 WHERE sku = $1`, sku, qty-1)
			return err == nil, err
		}, plainLeft},
		{"baseline: SELECT … FOR UPDATE around it", true, plain, func(ctx context.Context, sku string) (bool, error) {
			sold := false
			err := pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
				var qty int
				if err := tx.QueryRow(ctx, `SELECT qty FROM sale WHERE sku = $1 FOR UPDATE`, sku).Scan(&qty); err != nil || qty <= 0 {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE sale SET qty = qty - 1 WHERE sku = $1`, sku)
				sold = err == nil
				return err
			})
			return sold, err
		}, plainLeft},
		{"conditional.Stock (coalesced)", false, func(sku string) error { return stock.Put(ctx, sku, units) }, take(stock),
			func(sku string) (int64, error) { return stock.Available(ctx, sku) }},
		{"conditional.Stock, 16 buckets", false, func(sku string) error { return buckets.Put(ctx, sku, units) }, take(buckets),
			func(sku string) (int64, error) { return buckets.Available(ctx, sku) }},
	}
	var rows []row
	for i, st := range strategies {
		sku := fmt.Sprint("sku-", i)
		if err := st.setup(sku); err != nil {
			return nil, err
		}
		var sold, done atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, buyers)
		sem := make(chan struct{}, 256) // buyers in flight at once
		stop := progress(env.out, st.what, &done, buyers)
		start := time.Now()
		for b := 0; b < buyers; b++ {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done(); done.Add(1) }()
				ok, err := st.buy(ctx, sku)
				if err != nil {
					errs <- err
				}
				if ok {
					sold.Add(1)
				}
			}()
		}
		wg.Wait()
		took := time.Since(start)
		stop()
		close(errs)
		for err := range errs {
			return nil, fmt.Errorf("%s: %w", st.what, err)
		}
		left, err := st.left(sku)
		if err != nil {
			return nil, err
		}
		oversold := max(sold.Load()-units, 0)
		fmt.Fprintf(env.out, "   %-40s sold %d of %d, oversold %d, left %d, %v (%.0f buyers/s)\n",
			st.what, sold.Load(), units, oversold, left, took.Round(time.Millisecond), buyers/took.Seconds())
		rows = append(rows, row{what: st.what,
			outcome: fmt.Sprintf("sold %d/%d, oversold %d, %.0f buyers/s", sold.Load(), units, oversold, buyers/took.Seconds()),
			ok:      sold.Load() == units && left == 0 && !st.baseline || st.baseline && oversold == 0 && sold.Load() == units})
	}
	return rows, nil
}
