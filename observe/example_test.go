package observe_test

// The example is a whole program: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// example runs and its Output is checked.

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/observe"
)

// One Observer, handed to a package as an option, sees what the pattern
// did: here a request and its replayed retry. The same function serves
// every package; an adapter turns it into metrics, traces or logs.
func ExampleObserver() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	key := uuid.NewString()
	logEvent := observe.Observer(func(ctx context.Context, e observe.Event) {
		fmt.Println(e.Name, e.Key == key)
	})
	store, err := idempotency.New(pool, idempotency.WithObserver(logEvent))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	for range 2 { // the request, then its retry
		_, err := store.Do(ctx, "orders", key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return []byte("order 1"), nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// idempotency.ran true
	// idempotency.replayed true
}
