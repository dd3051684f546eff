package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres, testenv.EnvKafka), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// newInbox returns an Inbox with its schema and an effects table (no
// unique constraint: a double apply shows as two rows).
func newInbox(t *testing.T, pool *pgxpool.Pool, opts ...inbox.Option) *inbox.Inbox {
	t.Helper()
	// Fast retries unless the test says otherwise.
	opts = append([]inbox.Option{inbox.WithBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)
	in, err := inbox.New(pool, "billing", opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := in.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS effects (id text NOT NULL, payload text)`); err != nil {
		t.Fatal(err)
	}
	return in
}
