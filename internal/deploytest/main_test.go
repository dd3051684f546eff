package deploytest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// pgxpool's background health check ends when the pool closes, which
	// happens in a cleanup; ignore it only while it winds down.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}
