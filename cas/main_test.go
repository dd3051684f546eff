package cas_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

func mustExec(t testing.TB, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) {
	t.Helper()
	if _, err := db.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}
