package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkStock sells one unit per operation from one hot key at 1, 4, 16
// and 64 clients, through the library and through the baselines, in the
// same run, and reports units/s. Compare within a run only (scripts/bench
// prints the ratios):
//
//	bare        the bare conditional UPDATE on one row, no library
//	forupdate   BEGIN; SELECT … FOR UPDATE; UPDATE; COMMIT
//	advisory    BEGIN; pg_advisory_xact_lock; UPDATE; COMMIT
//	ceiling     the bare UPDATE, each client on its own row (no contention)
//	take        Stock.Take, coalescing on (the default)
//	admission   Stock.Take, coalescing off: one statement in flight
//	buckets=N   Stock.Take over N buckets, coalescing on
func BenchmarkStock(b *testing.B) {
	ctx := context.Background()
	pool, _ := testenv.PostgresSchema(b, 80)
	mustExec(b, pool, `CREATE TABLE plain (key text PRIMARY KEY, qty bigint NOT NULL CHECK (qty >= 0)) WITH (fillfactor = 70)`)
	mustExec(b, pool, `INSERT INTO plain SELECT 'c' || i, 1e15 FROM generate_series(0, 63) i UNION ALL SELECT 'hot', 1e15`)
	const take1 = `UPDATE plain SET qty = qty - 1 WHERE key = $1 AND qty >= 1`

	stock := func(b *testing.B, key string, opts ...conditional.Option) *conditional.Stock {
		s, err := conditional.NewStock(pool, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if err := s.CreateSchema(ctx); err != nil {
			b.Fatal(err)
		}
		if err := s.Put(ctx, key, 1e15); err != nil {
			b.Fatal(err)
		}
		return s
	}
	granted := func(tag interface{ RowsAffected() int64 }, err error) error {
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("refused")
		}
		return err
	}

	scenarios := []struct {
		name string
		op   func(b *testing.B) func(ctx context.Context, client int) error
	}{
		{"bare", func(*testing.B) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error { return granted(pool.Exec(ctx, take1, "hot")) }
		}},
		{"forupdate", func(*testing.B) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var q int64
					if err := tx.QueryRow(ctx, `SELECT qty FROM plain WHERE key = 'hot' FOR UPDATE`).Scan(&q); err != nil {
						return err
					}
					return granted(tx.Exec(ctx, take1, "hot"))
				})
			}
		}},
		{"advisory", func(*testing.B) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('hot'))`); err != nil {
						return err
					}
					return granted(tx.Exec(ctx, take1, "hot"))
				})
			}
		}},
		{"ceiling", func(*testing.B) func(context.Context, int) error {
			return func(ctx context.Context, c int) error { return granted(pool.Exec(ctx, take1, fmt.Sprintf("c%d", c))) }
		}},
		{"take", func(b *testing.B) func(context.Context, int) error {
			s := stock(b, "take")
			return func(ctx context.Context, _ int) error { return s.Take(ctx, "take", 1) }
		}},
		{"admission", func(b *testing.B) func(context.Context, int) error {
			s := stock(b, "admission", conditional.WithCoalescing(false))
			return func(ctx context.Context, _ int) error { return s.Take(ctx, "admission", 1) }
		}},
	}
	for _, n := range []int{4, 16, 64} {
		key := fmt.Sprintf("buckets%d", n)
		scenarios = append(scenarios, struct {
			name string
			op   func(b *testing.B) func(ctx context.Context, client int) error
		}{fmt.Sprintf("buckets=%d", n), func(b *testing.B) func(context.Context, int) error {
			s := stock(b, key, conditional.WithBuckets(n))
			return func(ctx context.Context, _ int) error { return s.Take(ctx, key, 1) }
		}})
	}

	for _, sc := range scenarios {
		for _, clients := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", sc.name, clients), func(b *testing.B) {
				testenv.RunClients(b, clients, "units", sc.op(b))
			})
		}
	}
}

func mustExec(b testing.TB, pool *pgxpool.Pool, sql string) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStockSellOut sells a whole stock of 2,000 units over 64 buckets
// to 64 clients buying one unit at a time until it is gone, with and
// without the endgame (WithEndgame(500)), and reports units/s over the
// whole sale, the end included: that is where random buckets are mostly
// empty and takes go across buckets.
func BenchmarkStockSellOut(b *testing.B) {
	ctx := context.Background()
	pool, _ := testenv.PostgresSchema(b, 80)
	for _, sc := range []struct {
		name string
		opts []conditional.Option
	}{
		{"buckets=64", []conditional.Option{conditional.WithBuckets(64)}},
		{"buckets=64+endgame", []conditional.Option{conditional.WithBuckets(64), conditional.WithEndgame(500)}},
	} {
		b.Run(sc.name, func(b *testing.B) {
			s, err := conditional.NewStock(pool, append(sc.opts, conditional.WithTable("sellout"))...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.CreateSchema(ctx); err != nil {
				b.Fatal(err)
			}
			const units, clients = 2000, 64
			var took time.Duration
			for i := 0; i < b.N; i++ {
				key := fmt.Sprintf("%s-%d", sc.name, i)
				if err := s.Put(ctx, key, units); err != nil {
					b.Fatal(err)
				}
				var sold atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for c := 0; c < clients; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							err := s.Take(ctx, key, 1)
							if errors.Is(err, conditional.ErrSoldOut) {
								return
							}
							if err != nil {
								b.Error(err)
								return
							}
							sold.Add(1)
						}
					}()
				}
				wg.Wait()
				took += time.Since(start)
				if sold.Load() != units {
					b.Fatalf("sold %d of %d", sold.Load(), units)
				}
			}
			b.ReportMetric(float64(units*b.N)/took.Seconds(), "units/s")
		})
	}
}
