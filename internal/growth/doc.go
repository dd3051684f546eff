// Package growth has no code of its own: its tests and benchmarks run the
// patterns, through their public APIs, on tables of the size a service
// reaches after months (idempotency records, inbox ids, holds, stock and
// lease rows) and while retention deletes from them.
//
// Set NOLOCK_BENCH_ROWS (default 10,000) to the rows each benchmark fills
// its pattern's table with before it measures:
//
//	NOLOCK_BENCH_ROWS=1e7 go test -run '^$' -bench Growth -benchtime 3000x ./internal/growth
//
// Every figure is a ratio of two rates measured in the same rounds (see
// testenv.Compare), so the machine's load cancels out of it.
package growth
