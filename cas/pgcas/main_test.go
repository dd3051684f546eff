package pgcas_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}
