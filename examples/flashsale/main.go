// Command flashsale sells a few hundred units of one hot product to
// thousands of concurrent buyers with conditional.Stock, and checks that
// exactly the stock was sold: no oversell, and nobody was told "sold out"
// while units remained.
//
//	go run ./examples/flashsale -dsn postgres://… [-units 500] [-buyers 5000] [-buckets 1]
//
// The DSN defaults to $NOLOCK_TEST_POSTGRES (see scripts/services).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	units := flag.Int64("units", 500, "units on sale")
	buyers := flag.Int("buyers", 5000, "concurrent buyers, one unit each")
	buckets := flag.Int("buckets", 1, "rows the stock is spread over")
	flag.Parse()
	if err := run(context.Background(), *dsn, *units, *buyers, *buckets); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string, units int64, buyers, buckets int) error {
	if dsn == "" {
		return errors.New("no -dsn and no NOLOCK_TEST_POSTGRES: run scripts/services up, then eval \"$(scripts/services env)\"")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	stock, err := conditional.NewStock(pool, conditional.WithBuckets(buckets))
	if err != nil {
		return err
	}
	defer stock.Close()
	if err := stock.CreateSchema(ctx); err != nil {
		return err
	}
	sku := fmt.Sprintf("flashsale-%d", time.Now().UnixNano())
	if err := stock.Put(ctx, sku, units); err != nil {
		return err
	}

	var sold, refused, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < buyers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch err := stock.Take(ctx, sku, 1); {
			case err == nil:
				sold.Add(1)
			case errors.Is(err, conditional.ErrSoldOut):
				refused.Add(1)
			default:
				failed.Add(1)
				log.Print(err)
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	left, err := stock.Available(ctx, sku)
	if err != nil {
		return err
	}
	fmt.Printf("%d buyers, %d units, %d bucket(s): sold %d, refused %d, failed %d, left %d in %v\n",
		buyers, units, buckets, sold.Load(), refused.Load(), failed.Load(), left, took.Round(time.Millisecond))
	want := min(units, int64(buyers))
	if sold.Load() != want || sold.Load()+left != units || failed.Load() != 0 {
		return fmt.Errorf("invariant broken: sold %d, want %d; sold+left %d, want %d", sold.Load(), want, sold.Load()+left, units)
	}
	fmt.Println("oversold 0, undersold 0")
	return nil
}
