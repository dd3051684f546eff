package pgschema_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// concurrency is how many callers create one schema at once: enough that,
// without the advisory lock, some of them fail with 23505.
const concurrency = 30

// Every package's CreateSchema, called 30 times at once on a fresh
// schema, succeeds every time, and the tables it creates exist once.
func TestConcurrentCreateSchema(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error
	}{
		{"cas", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			b, err := pgcas.NewBackend(pool)
			must(t, err)
			return b.CreateSchema
		}},
		{"conditional.Stock", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			s, err := conditional.NewStock(pool)
			must(t, err)
			t.Cleanup(func() { _ = s.Close() })
			return s.CreateSchema
		}},
		{"conditional.Holds", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			h, err := conditional.NewHolds(pool)
			must(t, err)
			return h.CreateSchema
		}},
		{"idempotency", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			s, err := idempotency.New(pool)
			must(t, err)
			return s.CreateSchema
		}},
		{"inbox", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			in, err := inbox.New(pool, "c")
			must(t, err)
			return in.CreateSchema
		}},
		{"partition", func(t *testing.T, pool *pgxpool.Pool) func(context.Context) error {
			c, err := partition.New(pool, []string{"127.0.0.1:1"}, "g", []string{"t"})
			must(t, err)
			return c.CreateSchema
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := testenv.PostgresSchema(t, concurrency)
			create := tc.setup(t, pool)
			if errs := hammer(create); len(errs) > 0 {
				t.Fatalf("%d of %d concurrent CreateSchema calls failed; first: %v", len(errs), concurrency, errs[0])
			}
			var tables int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables)
			if err != nil || tables == 0 {
				t.Fatalf("%d tables in the schema (%v), want some", tables, err)
			}
			if errs := hammer(create); len(errs) > 0 { // and again, on the existing schema
				t.Fatalf("%d of %d calls on an existing schema failed; first: %v", len(errs), concurrency, errs[0])
			}
		})
	}
}

// Create without a Begin method sends the lock and the DDL as one
// simple-protocol string: one implicit transaction, just as safe.
func TestConcurrentCreateWithoutBegin(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, concurrency)
	ddl := `CREATE TABLE IF NOT EXISTS a (id int PRIMARY KEY); CREATE INDEX IF NOT EXISTS a_id ON a (id);
CREATE TABLE IF NOT EXISTS b (id int PRIMARY KEY)`
	if errs := hammer(func(ctx context.Context) error { return pgschema.Create(ctx, execOnly{pool}, ddl) }); len(errs) > 0 {
		t.Fatalf("%d of %d concurrent calls failed; first: %v", len(errs), concurrency, errs[0])
	}
}

// execOnly hides the pool's Begin.
type execOnly struct{ pgschema.Execer }

// hammer runs create from concurrency goroutines released at once and
// returns their errors.
func hammer(create func(context.Context) error) []error {
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := create(context.Background()); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
