package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/services"
)

// PostgresDSN returns the DSN of the test server (NOLOCK_TEST_POSTGRES).
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return need(t, EnvPostgres)
}

// Postgres returns a pool whose connections use a fresh schema as their
// search_path, so unqualified table names land there. The schema and
// everything in it is dropped, and the pool closed, when the test ends.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, _ := PostgresSchema(t, 0)
	return pool
}

// PostgresSchema is Postgres with a pool size (0 means pgxpool's default)
// that also returns the schema's name, for tests that open more pools or
// processes on the same schema (see PostgresDSNFor).
func PostgresSchema(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := PostgresDSN(t)
	schema := Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", EnvPostgres, err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatalf("testenv: create schema: %v", err)
	}
	t.Cleanup(func() { dropSchema(t, dsn, schema) })
	pool := Pool(t, PostgresDSNFor(t, schema), maxConns)
	return pool, schema
}

// PostgresDSNFor returns the test server's DSN with search_path set to schema.
func PostgresDSNFor(t testing.TB, schema string) string {
	t.Helper()
	dsn, err := services.WithSearchPath(PostgresDSN(t), schema)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvPostgres, err)
	}
	return dsn
}

// Pool opens a pool on dsn (maxConns 0 means the default) and closes it when
// the test ends.
func Pool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: open pool: %v", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("testenv: ping %s: %v", EnvPostgres, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func dropSchema(t testing.TB, dsn, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Errorf("testenv: drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("testenv: drop schema %s: %v", schema, err)
	}
}

// PostgresFreshDSN returns a DSN whose search_path is a fresh schema,
// dropped when the test ends: for code under test that opens its own pool.
func PostgresFreshDSN(t testing.TB) string {
	t.Helper()
	_, schema := PostgresSchema(t, 1)
	return PostgresDSNFor(t, schema)
}
