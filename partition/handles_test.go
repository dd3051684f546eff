package partition_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
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
	brokers := []string{"127.0.0.1:1"} // New does no I/O
	for handle, db := range map[string]partition.DB{"*pgx.Conn": conn, "pgx.Tx": tx} {
		c, err := partition.New(db, brokers, "g", []string{"orders"})
		if !errors.Is(err, partition.ErrInvalid) || !strings.Contains(err.Error(), handle) || c != nil {
			t.Errorf("New on a %s: %v, %v; want ErrInvalid naming it", handle, c, err)
		}
	}
	for handle, db := range map[string]interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}{"*pgx.Conn": conn, "pgx.Tx": tx} {
		var tables int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&tables); err != nil || tables != 0 {
			t.Errorf("after the refusal, on the %s: %d tables (%v); want 0", handle, tables, err)
		}
	}
}
