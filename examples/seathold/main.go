// Command seathold shows Tatkal-style seat holds with conditional.Holds
// (PostgreSQL) or dynamoconditional.Holds: many passengers race for the
// last seats (each asks HoldAny for any free one), each seat goes to
// exactly one, and a passenger who stalls past the hold's expiry cannot
// confirm a seat someone else has since taken. PostgreSQL judges expiry by the database's clock; DynamoDB, which
// has no clock a condition can read, by the callers'.
//
//	go run ./examples/seathold [-backend postgres|dynamodb] [-seats 10] [-passengers 200]
//
// The DSN defaults to $DATABASE_URL, the endpoint to
// $AWS_ENDPOINT_URL_DYNAMODB, else $AWS_ENDPOINT_URL.
package main

import (
	"cmp"
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
	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/examples/localdynamo"
)

func main() {
	backend := flag.String("backend", "postgres", "where the seats live: postgres or dynamodb")
	dsn := flag.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	endpoint := flag.String("dynamodb", cmp.Or(os.Getenv("AWS_ENDPOINT_URL_DYNAMODB"), os.Getenv("AWS_ENDPOINT_URL")), "DynamoDB endpoint URL")
	seats := flag.Int("seats", 10, "seats on the train")
	passengers := flag.Int("passengers", 200, "passengers racing for them")
	flag.Parse()
	ctx := context.Background()
	var holds seatHolds
	var done func()
	var err error
	switch *backend {
	case "postgres":
		holds, done, err = onPostgres(ctx, *dsn)
	case "dynamodb":
		holds, done, err = onDynamoDB(ctx, *endpoint)
	default:
		err = fmt.Errorf("-backend %q: want postgres or dynamodb", *backend)
	}
	if err != nil {
		log.Fatal(err)
	}
	err = run(ctx, holds, *seats, *passengers)
	done()
	if err != nil {
		log.Fatal(err)
	}
}

// seatHolds is what the example uses of conditional.Holds and
// dynamoconditional.Holds: both have these methods, with the same
// guarantees.
type seatHolds interface {
	Add(ctx context.Context, resources ...string) error
	Hold(ctx context.Context, resource, holder string, ttl time.Duration) (until time.Time, err error)
	HoldAny(ctx context.Context, resources []string, holder string, ttl time.Duration) (resource string, until time.Time, err error)
	Free(ctx context.Context, resources []string) ([]string, error)
	Confirm(ctx context.Context, resource, holder string) error
}

// onPostgres returns Holds on dsn's database, its table created, and a
// func that closes the pool.
func onPostgres(ctx context.Context, dsn string) (*conditional.Holds, func(), error) {
	if dsn == "" {
		return nil, nil, errors.New("no -postgres and no DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	holds, err := conditional.NewHolds(pool)
	if err == nil {
		err = holds.CreateSchema(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return holds, pool.Close, nil
}

// onDynamoDB returns dynamoconditional.Holds on a new table at endpoint, and a func
// that deletes the table.
func onDynamoDB(ctx context.Context, endpoint string) (*dynamoconditional.Holds, func(), error) {
	if endpoint == "" {
		return nil, nil, errors.New("no -dynamodb and no AWS_ENDPOINT_URL_DYNAMODB or AWS_ENDPOINT_URL")
	}
	db := localdynamo.Client(endpoint)
	table := fmt.Sprintf("nolock_seats_%d", time.Now().UnixNano())
	drop, err := localdynamo.CreateTable(ctx, db, table, "pk") // NewHolds' default key attribute
	if err != nil {
		return nil, nil, err
	}
	holds, err := dynamoconditional.NewHolds(db, table)
	if err != nil {
		drop()
		return nil, nil, err
	}
	return holds, drop, nil
}

// run races passengers for seats on holds, then shows a stalled holder
// refused, and returns an error if any invariant broke.
func run(ctx context.Context, holds seatHolds, seats, passengers int) error {
	train := fmt.Sprintf("train-%d", time.Now().UnixNano())
	seat := func(i int) string { return fmt.Sprintf("%s/seat-%02d", train, i) }
	all := make([]string, seats)
	for i := range all {
		all[i] = seat(i)
	}
	if err := holds.Add(ctx, all...); err != nil {
		return err
	}

	// Every passenger asks for any free seat (HoldAny picks one at random
	// among the free ones, so they do not all fight over seat 00), then
	// confirms it. When none is free, HoldAny says so with ErrHeld.
	owner := map[string]string{}
	doubles, refused := 0, 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := 0; p < passengers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			me := fmt.Sprintf("passenger-%03d", p)
			seat, _, err := holds.HoldAny(ctx, all, me, time.Minute)
			if err == nil {
				err = holds.Confirm(ctx, seat, me)
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, conditional.ErrHeld):
				refused++ // every seat held or booked by others
			case err != nil:
				log.Printf("%s: %v", me, err)
			default:
				if owner[seat] != "" {
					doubles++
				}
				owner[seat] = me
			}
		}()
	}
	wg.Wait()
	free, err := holds.Free(ctx, all)
	if err != nil {
		return err
	}
	booked := len(owner)
	fmt.Printf("%d passengers, %d seats: %d seats booked, each by exactly one passenger; %d free\n", passengers, seats, booked, len(free))
	if want := min(seats, passengers); booked != want || doubles != 0 || len(free) != seats-want {
		return fmt.Errorf("booked %d seats (want %d), %d double bookings, %d free", booked, want, doubles, len(free))
	}

	// A stalled passenger: Asha holds a seat for 300 ms, then stalls (a GC
	// pause, a tunnel) for a second. Ravi takes the expired seat. Asha wakes
	// and tries to confirm: refused, because the row (or item) decides.
	extra := train + "/seat-extra"
	if err := holds.Add(ctx, extra); err != nil {
		return err
	}
	if _, err := holds.Hold(ctx, extra, "asha", 300*time.Millisecond); err != nil {
		return err
	}
	time.Sleep(time.Second) // Asha is paused; her hold expires
	if free, err := holds.Free(ctx, []string{extra}); err != nil || len(free) != 1 {
		return fmt.Errorf("asha's ended hold: free %v, %v; want it free", free, err)
	}
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
