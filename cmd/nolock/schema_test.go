package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The printed DDL applies cleanly to an empty schema, twice (it is
// idempotent), and creates every table.
func TestSchemaApplies(t *testing.T) {
	var out bytes.Buffer
	if err := schema(&out); err != nil {
		t.Fatal(err)
	}
	pool := testenv.Postgres(t)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := pool.Exec(ctx, out.String()); err != nil {
			t.Fatalf("applying the schema (pass %d): %v", i+1, err)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 9 {
		t.Fatalf("%d tables created, want 9", n)
	}
}
