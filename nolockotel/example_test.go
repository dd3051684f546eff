package nolockotel_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/nolockotel"
)

// One Adapter, on the global providers, observes every package; a span
// around the calls parents the library's spans. (No Output: go test only
// compiles it; TestWorkloadPostgres runs the same calls.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	a, err := nolockotel.New() // otel.GetMeterProvider(), otel.GetTracerProvider()
	if err != nil {
		log.Fatal(err)
	}
	store, err := idempotency.New(pool, idempotency.WithObserver(a.Observe))
	if err != nil {
		log.Fatal(err)
	}

	ctx, span := otel.Tracer("shop").Start(ctx, "checkout")
	defer span.End()
	_, err = store.Do(ctx, "orders", "order-1", []byte("cart-7"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return []byte("ok"), pgcas.Retry(ctx, tx, func(ctx context.Context, tx pgx.Tx) error {
			return pgcas.Exec(ctx, tx, `UPDATE stock SET n = n - 1, version = version + 1 WHERE sku = 'a' AND n > 0`)
		}, cas.WithObserver(a.Observe))
	})
	if err != nil {
		log.Fatal(err)
	}
}
