package observe_test

// The example is a whole program: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). Under go test, TestMain points DATABASE_URL at a
// fresh schema on the test services (see testenv.ExampleMain), so the
// example runs and its Output is checked.

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/observe"
)

// One Observer, handed to a package as an option, sees what the pattern
// did: here a request and its replayed retry, each call's outcome
// (observe.Func sees End's events and Event's alike). The same function
// serves every package; an adapter turns it into metrics, traces or logs.
func ExampleObserver() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	key := uuid.NewString()
	logEvent := observe.Func(func(ctx context.Context, e observe.Event) {
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

// A log line per event, through slog: the observer of a lease Client sees
// the acquisition and the release. (The handler drops times and
// durations, so the output below is stable.)
func ExampleObserver_slog() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "took" {
				return slog.Attr{}
			}
			return a
		}}))
	locks, err := lease.New(pool, lease.WithObserver(observe.Func(func(ctx context.Context, e observe.Event) {
		logger.InfoContext(ctx, e.Name, "key", e.Key, "token", e.Token, "took", e.Duration, "err", e.Err)
	})))
	if err != nil {
		log.Fatal(err)
	}
	if err := locks.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	lock, err := locks.Acquire(ctx, "jobs/reindex")
	if err != nil {
		log.Fatal(err)
	}
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	locks.Close() // returns once the observer has had every event
	// Output:
	// level=INFO msg=lease.acquired key=jobs/reindex token=1 err=<nil>
	// level=INFO msg=lease.released key=jobs/reindex token=1 err=<nil>
}

// callKey carries, in the context Start returns, the call that began: a
// tracing adapter puts its span there.
type callKey struct{}

// spans is an Observer that starts a "span" when a call begins and ends
// it with the call's outcome: the shape of a tracing adapter.
type spans struct{}

func (spans) Start(ctx context.Context, c observe.Call) context.Context {
	fmt.Println("start", c.Name)
	return context.WithValue(ctx, callKey{}, c.Name)
}

func (spans) End(ctx context.Context, e observe.Event) {
	fmt.Println("end", ctx.Value(callKey{}), "with", e.Name)
}

func (spans) Event(ctx context.Context, e observe.Event) {
	fmt.Println("event", e.Name, "in", ctx.Value(callKey{}))
}

// An Observer's Start begins a call: the call's callback (here Do's fn)
// gets the context Start returned, so what it starts (a pgx query's span)
// nests under the call's; End gets that context too, with the outcome.
func ExampleObserver_spans() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := idempotency.New(pool, idempotency.WithObserver(spans{}))
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = store.Do(ctx, "orders", uuid.NewString(), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		fmt.Println("fn runs in", ctx.Value(callKey{}))
		return []byte("order 1"), nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// start idempotency.do
	// fn runs in idempotency.do
	// end idempotency.do with idempotency.ran
}
