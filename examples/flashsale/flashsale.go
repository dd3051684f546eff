// Package flashsale sells a few hundred units of one hot product to
// thousands of concurrent buyers, the story `nolock demo` tells (-run
// 'flash sale'; examples/saleservice is the service to copy), four ways:
//
//   - read the stock, then write it back less one, with no lock (a
//     baseline: two buyers read the same count and both sell, so it
//     oversells);
//   - the same inside a transaction with SELECT … FOR UPDATE (a baseline:
//     correct, but every buyer waits for the row in turn);
//   - conditional.Stock, one conditional statement per batch of
//     concurrent takes (coalesced);
//   - conditional.Stock with the stock spread over buckets.
//
// Each sells exactly the stock with conditional.Stock: no oversell, and
// nobody is told "sold out" while units remain.
package flashsale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/observe"
)

// Config is where and how the story runs.
type Config struct {
	DSN      string           // PostgreSQL; the story's tables are made in its search_path
	Units    int64            // units on sale, per strategy
	Buyers   int              // buyers, one unit each, per strategy
	InFlight int              // buyers in flight at once
	Buckets  int              // rows the last strategy spreads the stock over
	Conns    int32            // the pool's connections
	Out      io.Writer        // the transcript
	Observer observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured: one Sale per strategy, in order.
type Report struct {
	Sales []Sale
}

// Sale is one strategy's outcome.
type Sale struct {
	Strategy string
	Baseline bool // shown for comparison, not nolock's: its outcome is not checked
	Units    int64
	Buyers   int
	Sold     int64 // buyers told they bought a unit
	Left     int64 // units the stock says remain
	Took     time.Duration
}

// Oversold is how many units were sold beyond the stock.
func (s Sale) Oversold() int64 { return max(s.Sold-s.Units, 0) }

// Exact reports whether the sale sold exactly the stock, or every buyer
// one unit if there were fewer buyers: no oversell, no undersell.
func (s Sale) Exact() bool {
	return s.Sold == min(s.Units, int64(s.Buyers)) && s.Sold+s.Left == s.Units
}

// Rate is buyers served per second.
func (s Sale) Rate() float64 { return float64(s.Buyers) / s.Took.Seconds() }

// strategy is one way to sell: setup puts units of sku on sale, buy sells
// one (false: sold out), left counts what remains.
type strategy struct {
	name     string
	baseline bool
	setup    func(ctx context.Context, sku string) error
	buy      func(ctx context.Context, sku string) (bool, error)
	left     func(ctx context.Context, sku string) (int64, error)
}

// Run tells the story and returns its report, or an error if a
// conditional.Stock sale was not exact.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Units < 1 || cfg.Buyers < 1 || cfg.InFlight < 1 || cfg.Buckets < 1 || cfg.Conns < 1 || cfg.Out == nil {
		return Report{}, errors.New("flashsale: need 1 or more units, buyers, buyers in flight, buckets and connections, and an Out")
	}
	poolCfg, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	poolCfg.MaxConns = cfg.Conns
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	stock, err := conditional.NewStock(pool, conditional.WithObserver(cfg.Observer))
	if err != nil {
		return Report{}, err
	}
	defer stock.Close()
	buckets, err := conditional.NewStock(pool, conditional.WithBuckets(cfg.Buckets), conditional.WithObserver(cfg.Observer))
	if err != nil {
		return Report{}, err
	}
	defer buckets.Close()
	if err := stock.CreateSchema(ctx); err != nil {
		return Report{}, err
	}
	run := time.Now().UnixNano()
	table := fmt.Sprintf("flashsale_%d", run) // the baselines' stock
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (sku text PRIMARY KEY, qty int NOT NULL)`); err != nil {
		return Report{}, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+table)

	plain := func(ctx context.Context, sku string) error {
		_, err := pool.Exec(ctx, `INSERT INTO `+table+` VALUES ($1, $2)`, sku, cfg.Units)
		return err
	}
	plainLeft := func(ctx context.Context, sku string) (n int64, err error) {
		err = pool.QueryRow(ctx, `SELECT qty FROM `+table+` WHERE sku = $1`, sku).Scan(&n)
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
	put := func(s *conditional.Stock) func(context.Context, string) error {
		return func(ctx context.Context, sku string) error { return s.Put(ctx, sku, cfg.Units) }
	}
	strategies := []strategy{
		{"baseline: read, then write (no lock)", true, plain, func(ctx context.Context, sku string) (bool, error) {
			var qty int
			if err := pool.QueryRow(ctx, `SELECT qty FROM `+table+` WHERE sku = $1`, sku).Scan(&qty); err != nil || qty <= 0 {
				return false, err
			}
			_, err := pool.Exec(ctx, `UPDATE `+table+` SET qty = $2 WHERE sku = $1`, sku, qty-1)
			return err == nil, err
		}, plainLeft},
		{"baseline: SELECT … FOR UPDATE around it", true, plain, func(ctx context.Context, sku string) (bool, error) {
			sold := false
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var qty int
				if err := tx.QueryRow(ctx, `SELECT qty FROM `+table+` WHERE sku = $1 FOR UPDATE`, sku).Scan(&qty); err != nil || qty <= 0 {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE `+table+` SET qty = qty - 1 WHERE sku = $1`, sku)
				sold = err == nil
				return err
			})
			return sold, err
		}, plainLeft},
		{"conditional.Stock (coalesced)", false, put(stock), take(stock), stock.Available},
		{fmt.Sprintf("conditional.Stock, %d buckets", cfg.Buckets), false, put(buckets), take(buckets), buckets.Available},
	}
	var rep Report
	for i, st := range strategies {
		sale, err := sell(ctx, cfg, st, fmt.Sprintf("flashsale-%d-%d", run, i))
		if err != nil {
			return rep, fmt.Errorf("flashsale: %s: %w", st.name, err)
		}
		rep.Sales = append(rep.Sales, sale)
		fmt.Fprintf(cfg.Out, "   %-40s sold %d of %d, oversold %d, left %d, %v (%.0f buyers/s)\n",
			sale.Strategy, sale.Sold, sale.Units, sale.Oversold(), sale.Left, sale.Took.Round(time.Millisecond), sale.Rate())
		if !sale.Baseline && !sale.Exact() {
			return rep, fmt.Errorf("flashsale: %s sold %d of %d units to %d buyers, %d left: not exact", sale.Strategy, sale.Sold, sale.Units, sale.Buyers, sale.Left)
		}
	}
	return rep, nil
}

// sell puts cfg.Units of sku on sale with st and has cfg.Buyers buyers,
// cfg.InFlight at a time, buy one unit each.
func sell(ctx context.Context, cfg Config, st strategy, sku string) (Sale, error) {
	if err := st.setup(ctx, sku); err != nil {
		return Sale{}, err
	}
	var sold atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Buyers)
	inFlight := make(chan struct{}, cfg.InFlight)
	start := time.Now()
	for b := 0; b < cfg.Buyers; b++ {
		inFlight <- struct{}{}
		wg.Go(func() {
			defer func() { <-inFlight }()
			ok, err := st.buy(ctx, sku)
			if err != nil {
				errs <- err
			}
			if ok {
				sold.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return Sale{}, err
	}
	left, err := st.left(ctx, sku)
	return Sale{Strategy: st.name, Baseline: st.baseline, Units: cfg.Units, Buyers: cfg.Buyers, Sold: sold.Load(), Left: left, Took: took}, err
}
