package testenv

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"os"
	"strings"
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

// PostgresConn opens a *pgx.Conn on the test server with search_path set
// to schema, and closes it when the test ends: for tests of a package on
// a single connection rather than a pool.
func PostgresConn(t testing.TB, schema string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), PostgresDSNFor(t, schema))
	if err != nil {
		t.Fatalf("testenv: connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Pool opens a pool on dsn (maxConns 0 means the default) and closes it when
// the test ends.
func Pool(t testing.TB, dsn string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return PoolWith(t, dsn, func(cfg *pgxpool.Config) {
		if maxConns > 0 {
			cfg.MaxConns = maxConns
		}
	})
}

// PoolWith is Pool with its configuration, parsed from dsn, changed by
// configure first (a tracer, a hook after connecting).
func PoolWith(t testing.TB, dsn string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	configure(cfg)
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

// PostgresDatabase creates a database of the test's own on the shared
// server and returns its DSN; the database is dropped when the test ends.
// Its row of pg_stat_database counts the test's transactions alone (see
// Rollbacks).
func PostgresDatabase(t testing.TB) string {
	t.Helper()
	admin := PostgresDSN(t)
	name := Name("db")
	ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", EnvPostgres, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
		defer cancel()
		if conn, err := pgx.Connect(ctx, admin); err == nil {
			_, _ = conn.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
			conn.Close(ctx)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvPostgres, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Rollbacks returns the transactions rolled back (xact_rollback) on the
// database of dsn, once no session is connected to it: a session reports its counts by the time it
// ends. Close the pools on it first.
func Rollbacks(t testing.TB, dsn string) int64 {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	conn, err := pgx.Connect(context.Background(), PostgresDSN(t))
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", EnvPostgres, err)
	}
	defer conn.Close(context.Background())
	var n int64
	Until(t, "every session on "+db+" ended", func() (bool, error) {
		var left int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&left)
		return left == 0, err
	})
	if _, err := conn.Exec(context.Background(), `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(context.Background(), `SELECT xact_rollback FROM pg_stat_database WHERE datname = $1`, db).Scan(&n); err != nil {
		t.Fatalf("testenv: read pg_stat_database: %v", err)
	}
	return n
}

// ErrorLines starts counting the ERROR lines that the server of
// EnvPostgres writes to its log (EnvPostgresLog) for the database of dsn,
// one of PostgresDatabase's, and returns a function that gives the count
// so far. It needs the log_line_prefix scripts/services sets, which names
// each line's database; without it, or without the log, the test fails
// when services are required and is skipped otherwise.
func ErrorLines(t testing.TB, dsn string) func() int {
	t.Helper()
	path := need(t, EnvPostgresLog)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testenv: parse dsn: %v", err)
	}
	var prefix string
	conn, err := pgx.Connect(context.Background(), PostgresDSN(t))
	if err == nil {
		err = conn.QueryRow(context.Background(), `SHOW log_line_prefix`).Scan(&prefix)
		conn.Close(context.Background())
	}
	if err != nil {
		t.Fatalf("testenv: read log_line_prefix: %v", err)
	}
	if !strings.HasSuffix(prefix, " %qdb=%d ") {
		missing(t, "the PostgreSQL log does not name each line's database (log_line_prefix "+prefix+"): run `scripts/services up`")
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvPostgresLog, err)
	}
	from := st.Size()
	marker := []byte(" db=" + strings.TrimPrefix(u.Path, "/") + " ERROR:  ")
	return func() int {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatalf("testenv: %s: %v", EnvPostgresLog, err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil && st.Size() < from {
			from = 0 // cut short by scripts/services up
		}
		b, err := io.ReadAll(io.NewSectionReader(f, from, 1<<62))
		if err != nil {
			t.Fatalf("testenv: read %s: %v", EnvPostgresLog, err)
		}
		return bytes.Count(b, marker)
	}
}
