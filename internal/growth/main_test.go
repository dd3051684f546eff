package growth_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// defaultRows is what the benchmarks fill without NOLOCK_BENCH_ROWS: enough
// to run every statement on a table with rows, small enough for any run.
const defaultRows = 10_000

// clients is how many goroutines each growth benchmark runs its operation
// from.
const clients = 16

// randomKey is the key generated rows get: md5 of the row's number as a
// UUID, so a filled table's keys are spread over the key space as random
// UUIDs (the keys users send) are.
const randomKey = `md5(i::text)::uuid::text`
