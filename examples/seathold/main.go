// Command seathold shows Tatkal-style seat holds with conditional.Holds:
// many passengers race for the last seats, each seat goes to exactly one,
// and a passenger who stalls past the hold's expiry (judged by the
// database's clock) cannot confirm a seat someone else has since taken.
//
//	go run ./examples/seathold -dsn postgres://… [-seats 10] [-passengers 200]
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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
)

func main() {
	dsn := flag.String("dsn", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	seats := flag.Int("seats", 10, "seats on the train")
	passengers := flag.Int("passengers", 200, "passengers racing for them")
	flag.Parse()
	if err := run(context.Background(), *dsn, *seats, *passengers); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, dsn string, seats, passengers int) error {
	if dsn == "" {
		return errors.New("no -dsn and no NOLOCK_TEST_POSTGRES: run scripts/services up, then eval \"$(scripts/services env)\"")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	holds, err := conditional.NewHolds(pool)
	if err != nil {
		return err
	}
	if err := holds.CreateSchema(ctx); err != nil {
		return err
	}
	train := fmt.Sprintf("train-%d", time.Now().UnixNano())
	seat := func(i int) string { return fmt.Sprintf("%s/seat-%02d", train, i) }
	all := make([]string, seats)
	for i := range all {
		all[i] = seat(i)
	}
	if err := holds.Add(ctx, all...); err != nil {
		return err
	}

	// Every passenger tries every seat in turn until one hold succeeds,
	// then confirms it.
	owner := make([]string, seats)
	doubles := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := 0; p < passengers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprintf("passenger-%03d", p)
			for i := range all {
				if _, err := holds.Hold(ctx, all[(i+p)%seats], me, time.Minute); err != nil {
					continue // held by someone else: try the next seat
				}
				if err := holds.Confirm(ctx, all[(i+p)%seats], me); err != nil {
					log.Printf("%s: confirm: %v", me, err)
					return
				}
				mu.Lock()
				if owner[(i+p)%seats] != "" {
					doubles++
				}
				owner[(i+p)%seats] = me
				mu.Unlock()
				return
			}
		}()
	}
	wg.Wait()
	booked := 0
	for _, o := range owner {
		if o != "" {
			booked++
		}
	}
	fmt.Printf("%d passengers, %d seats: %d seats booked, each by exactly one passenger\n", passengers, seats, booked)
	if booked != min(seats, passengers) || doubles != 0 {
		return fmt.Errorf("booked %d seats (want %d), %d double bookings", booked, min(seats, passengers), doubles)
	}

	// A stalled passenger: Asha holds a seat for 300 ms, then stalls (a GC
	// pause, a tunnel) for a second. Ravi takes the expired seat. Asha wakes
	// and tries to confirm: refused, because the row decides.
	extra := train + "/seat-extra"
	if err := holds.Add(ctx, extra); err != nil {
		return err
	}
	if _, err := holds.Hold(ctx, extra, "asha", 300*time.Millisecond); err != nil {
		return err
	}
	time.Sleep(time.Second) // Asha is paused; her hold expires by the database's clock
	if _, err := holds.Hold(ctx, extra, "ravi", time.Minute); err != nil {
		return fmt.Errorf("ravi could not take the expired hold: %w", err)
	}
	if err := holds.Confirm(ctx, extra, "ravi"); err != nil {
		return err
	}
	err = holds.Confirm(ctx, extra, "asha")
	fmt.Printf("asha wakes after her hold expired and confirms: %v\n", err)
	if !errors.Is(err, conditional.ErrNotHolder) {
		return fmt.Errorf("asha's late confirm: %v, want ErrNotHolder", err)
	}
	fmt.Println("double bookings 0")
	return nil
}
