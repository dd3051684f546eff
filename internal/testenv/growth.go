package testenv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvBenchRows names the variable that sets how many rows a growth
// benchmark fills its pattern's table with (see Growth).
const EnvBenchRows = "NOLOCK_BENCH_ROWS"

// BenchRows returns EnvBenchRows as a count, or def when it is unset. A
// value that is not a positive integer fails the benchmark.
func BenchRows(t testing.TB, def int64) int64 {
	t.Helper()
	v := os.Getenv(EnvBenchRows)
	if v == "" {
		return def
	}
	n, err := strconv.ParseFloat(v, 64) // 1e7 reads as well as 10000000
	if err != nil || n < 1 || n != float64(int64(n)) {
		t.Fatalf("testenv: %s=%q: want a positive integer", EnvBenchRows, v)
	}
	return int64(n)
}

// Growth is a pattern's table twice, side by side in one schema of the
// test's own: Filled, which Fill fills with Rows rows generated on the
// server, and Empty, which holds only what the benchmark itself writes.
// Compare runs one operation against each in alternating rounds, so that
// drift on a shared machine cancels out of their ratio.
type Growth struct {
	Pool          *pgxpool.Pool
	Schema        string
	Rows          int64
	Filled, Empty string // unquoted table names (or prefixes) for the pattern's WithTable
}

// NewGrowth opens a pool of maxConns on a fresh schema and names the two
// tables after prefix.
func NewGrowth(t testing.TB, prefix string, rows int64, maxConns int32) *Growth {
	t.Helper()
	pool, schema := PostgresSchema(t, maxConns)
	return &Growth{Pool: pool, Schema: schema, Rows: rows, Filled: prefix + "_filled", Empty: prefix + "_empty"}
}

// Fill runs fill on the filled table, with {{table}} replaced by table's
// quoted name (one of Filled's tables: Filled itself or a table the
// pattern names after it) and $1 bound to Rows, then VACUUM ANALYZE on
// table and on empty (its Empty twin; "" for none), and logs the time it
// took and the filled table's sizes. fill is an INSERT … SELECT … FROM
// generate_series(1, $1): the rows never cross the wire.
func (g *Growth) Fill(t testing.TB, table, empty, fill string) {
	t.Helper()
	ctx := context.Background()
	q := pgx.Identifier{table}.Sanitize()
	start := time.Now()
	conn, err := g.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// A fill of 10^7 rows is one statement; let it sort and build in memory.
	for _, s := range []string{`SET maintenance_work_mem = '256MB'`, `SET work_mem = '256MB'`, `SET synchronous_commit = off`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// Indexes that back no constraint are dropped for the fill and built
	// again after it, which is many times faster than inserting 10^7
	// entries one by one into an index larger than shared_buffers.
	var names, defs []string
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(indexrelid::regclass::text), '{}'), coalesce(array_agg(pg_get_indexdef(indexrelid)), '{}') FROM pg_index i
WHERE indrelid = $1::regclass AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)`, pgx.Identifier{g.Schema, table}.Sanitize()).Scan(&names, &defs); err != nil {
		t.Fatalf("testenv: indexes of %s: %v", table, err)
	}
	for _, name := range names {
		if _, err := conn.Exec(ctx, `DROP INDEX `+name); err != nil {
			t.Fatalf("testenv: drop index %s: %v", name, err)
		}
	}
	if _, err := conn.Exec(ctx, strings.ReplaceAll(fill, "{{table}}", q), g.Rows); err != nil {
		t.Fatalf("testenv: fill %s: %v", table, err)
	}
	for _, def := range defs {
		if _, err := conn.Exec(ctx, def); err != nil {
			t.Fatalf("testenv: %s: %v", def, err)
		}
	}
	filled := time.Since(start)
	for _, name := range []string{table, empty} {
		if name == "" {
			continue
		}
		if _, err := conn.Exec(ctx, `VACUUM ANALYZE `+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatalf("testenv: vacuum %s: %v", name, err)
		}
	}
	for _, s := range []string{`RESET maintenance_work_mem`, `RESET work_mem`, `RESET synchronous_commit`} {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	total, indexes := g.Size(t, table)
	t.Logf("%s: %d rows filled in %v (vacuumed in %v more): %s in all, %s of it indexes (%.0f bytes a row)",
		table, g.Rows, filled.Round(time.Millisecond), (time.Since(start) - filled).Round(time.Millisecond),
		mb(total), mb(indexes), float64(total)/float64(g.Rows))
}

// Size returns table's pg_total_relation_size and pg_indexes_size.
func (g *Growth) Size(t testing.TB, table string) (total, indexes int64) {
	t.Helper()
	err := g.Pool.QueryRow(context.Background(), `SELECT pg_total_relation_size($1::regclass), pg_indexes_size($1::regclass)`,
		pgx.Identifier{g.Schema, table}.Sanitize()).Scan(&total, &indexes)
	if err != nil {
		t.Fatalf("testenv: size of %s: %v", table, err)
	}
	return total, indexes
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/(1<<20)) }

// GrowthRounds is how many rounds Compare runs.
const GrowthRounds = 20

// Compare runs b.N operations of filled and b.N of empty (the same
// operation on the Empty tables) over clients goroutines, in GrowthRounds
// rounds (see Rounds), after a few operations of each to open every
// connection and prepare every statement. It reports units/s (filled's)
// and x-empty: the median over the rounds of filled's rate over empty's in
// the same round (1.0: the filled table costs nothing more).
func Compare(b *testing.B, clients int, filled, empty func(ctx context.Context, client int) error) {
	Rounds(b, clients, 4*clients, 1, filled, empty)
	b.ResetTimer()
	took := Rounds(b, clients, b.N, GrowthRounds, filled, empty)
	b.StopTimer()
	b.ReportMetric(RoundsRate(took, b.N, 0), "units/s")
	b.ReportMetric(RoundsRatio(took, 0, 1), "x-empty")
}
