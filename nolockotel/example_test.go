package nolockotel_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/nolockotel"
)

// One Adapter observes every package: here a compare-and-set, a lock and
// an idempotent request with its retry, counted in nolock.events by event
// name. PostgreSQL comes from DATABASE_URL (a stand-in for your own);
// TestExamples points it at a fresh schema on the test services, runs the
// example and checks what it prints.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int, version bigint);
		INSERT INTO stock VALUES ('a', 5, 1)`); err != nil {
		log.Fatal(err)
	}
	reader := sdkmetric.NewManualReader() // in production: your exporter's reader
	meterProvider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = meterProvider.Shutdown(ctx) }()
	tracerProvider := sdktrace.NewTracerProvider()
	defer func() { _ = tracerProvider.Shutdown(ctx) }()
	edit := func(ctx context.Context, tx pgx.Tx) error {
		return pgcas.Exec(ctx, tx, `UPDATE stock SET n = n - 1, version = version + 1 WHERE sku = 'a' AND n > 0`)
	}

	work := func(ctx context.Context) error {
		// With no options, the global providers (otel.GetMeterProvider(),
		// otel.GetTracerProvider(), as set when New is called).
		a, err := nolockotel.New(
			nolockotel.WithMeterProvider(meterProvider),
			nolockotel.WithTracerProvider(tracerProvider),
		)
		if err != nil {
			return err
		}
		locks, err := lease.New(pool, lease.WithObserver(a.Observe))
		if err != nil {
			return err
		}
		defer locks.Close()
		store, err := idempotency.New(pool, idempotency.WithObserver(a.Observe))
		if err != nil {
			return err
		}
		if err := pgcas.Retry(ctx, pool, edit, cas.WithObserver(a.Observe)); err != nil {
			return err
		}

		if err := locks.CreateSchema(ctx); err != nil {
			return err
		}
		lock, err := locks.Acquire(ctx, "jobs/reindex")
		if err != nil {
			return err
		}
		if err := lock.Release(ctx); err != nil {
			return err
		}
		if err := store.CreateSchema(ctx); err != nil {
			return err
		}
		for range 2 { // a request and its retry
			_, err := store.Do(ctx, "orders", "order-1", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				return []byte("ok"), nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := work(ctx); err != nil {
		log.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == nolockotel.MetricEvents {
				for _, dp := range sum.DataPoints {
					name, _ := dp.Attributes.Value(nolockotel.AttrEvent)
					lines = append(lines, fmt.Sprintf("%s %d", name.AsString(), dp.Value))
				}
			}
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
}

// TestExamples runs Example against the test services, in a fresh schema.
func TestExamples(t *testing.T) {
	t.Setenv("DATABASE_URL", testenv.PostgresFreshDSN(t))
	got := testenv.Printed(t, Example)
	want := "cas.committed 1\nidempotency.ran 1\nidempotency.replayed 1\nlease.acquired 1\nlease.released 1\n"
	if got != want {
		t.Errorf("printed\n%s\nwant\n%s", got, want)
	}
}
