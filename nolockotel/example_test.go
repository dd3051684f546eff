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
	"go.opentelemetry.io/otel/attribute"
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
// an idempotent request with its retry, each event in the instrument of
// its meaning (a lock's wait and hold, a call's duration, an outcome), and
// the idempotency table's oldest unreaped record (none is due: 0). PostgreSQL comes from DATABASE_URL (a stand-in for your own);
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
		a, err := nolockotel.New(nolockotel.WithMeterProvider(meterProvider), nolockotel.WithTracerProvider(tracerProvider))
		if err != nil {
			return err
		}
		locks, err := lease.New(pool, lease.WithObserver(a))
		if err != nil {
			return err
		}
		defer locks.Close()
		store, err := idempotency.New(pool, idempotency.WithObserver(a))
		if err != nil {
			return err
		}
		if _, err := a.ObserveTables(pool, nolockotel.Tables{Idempotency: []string{idempotency.DefaultTable}}); err != nil {
			return err
		}

		if err := pgcas.Retry(ctx, pool, edit, cas.WithObserver(a)); err != nil {
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
	var lines []string // each instrument's count or value per event (or per table)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s %d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s %d", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Count))
				}
			case metricdata.Gauge[float64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %s %g", m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder()), dp.Value))
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
	want := `nolock.lock.held nolock.pattern=lease 0
nolock.lock.hold.duration nolock.event=lease.released 1
nolock.lock.wait.duration nolock.call=lease.acquire,nolock.event=lease.acquired 1
nolock.operation.duration nolock.call=cas.retry_op,nolock.event=cas.committed 1
nolock.operation.duration nolock.call=idempotency.do,nolock.event=idempotency.ran 1
nolock.operation.duration nolock.call=idempotency.do,nolock.event=idempotency.replayed 1
nolock.operation.duration nolock.call=lease.release,nolock.event=lease.released 1
nolock.unreaped.age nolock.table=nolock_idempotency 0
`
	if got != want {
		t.Errorf("printed\n%s\nwant\n%s", got, want)
	}
}
