// Command flashsale runs package flashsale's story: thousands of
// concurrent buyers for a few hundred units of one product, sold four
// ways (read-then-write, SELECT … FOR UPDATE, conditional.Stock, and
// conditional.Stock over buckets); it exits non-zero unless
// conditional.Stock sold exactly the stock.
//
//	go run ./examples/flashsale/cmd/flashsale [-postgres postgres://…] [-units 300] [-buyers 5000] [-inflight 256] [-buckets 16]
//
// The DSN defaults to $NOLOCK_TEST_POSTGRES (see scripts/services).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/nolock/nolock/examples/flashsale"
)

func main() {
	dsn := flag.String("postgres", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	units := flag.Int64("units", 300, "units on sale")
	buyers := flag.Int("buyers", 5000, "buyers, one unit each")
	inFlight := flag.Int("inflight", 256, "buyers in flight at once")
	buckets := flag.Int("buckets", 16, "rows the last strategy spreads the stock over")
	conns := flag.Int("conns", 40, "connections in the pool")
	flag.Parse()
	if *dsn == "" {
		log.Fatal(`no -postgres and no NOLOCK_TEST_POSTGRES: run scripts/services up, then eval "$(scripts/services env)"`)
	}
	_, err := flashsale.Run(context.Background(), flashsale.Config{
		DSN: *dsn, Units: *units, Buyers: *buyers, InFlight: *inFlight, Buckets: *buckets, Conns: int32(*conns), Out: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("conditional.Stock: oversold 0, undersold 0")
}
