package lease_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// New refuses a *pgx.Conn and a pgx.Tx with ErrInvalid naming the handle,
// before any I/O: no table is made, and both handles stay usable.
func TestNewRefusesOneConnectionHandles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 0)
	conn := testenv.PostgresConn(t, schema)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for handle, db := range map[string]lease.DB{"*pgx.Conn": conn, "pgx.Tx": tx} {
		c, err := lease.New(db)
		if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), handle) || c != nil {
			t.Errorf("New on a %s: %v, %v; want ErrInvalid naming it", handle, c, err)
		}
		var tables int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil || tables != 0 {
			t.Errorf("after the refusal, on the %s: %d tables (%v); want 0", handle, tables, err)
		}
	}
}
