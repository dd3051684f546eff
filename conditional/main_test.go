package conditional_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	// pgxpool's background health check ends when the pool closes, which
	// testenv does in a cleanup; ignore it only while it winds down.
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}
