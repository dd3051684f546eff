package cas_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkUpdate increments one hot key (or, for manykeys, one key per
// client) at 1, 4, 16 and 64 clients and reports committed updates/s, p99
// latency and attempts per update, with the baselines in the same run:
//
//	bare        UPDATE counters SET n = n + 1 WHERE key = $1: one statement, no read
//	forupdate   BEGIN; SELECT … FOR UPDATE; UPDATE; COMMIT (a pessimistic lock)
//	raw         Store.Update with NoCoalescing: plain CAS with full-jitter backoff
//	admission   Store.Update, combining off: one read-modify-write per key at a time
//	combined    Store.Update (the default)
//	manykeys    raw CAS, each client on its own key (no contention)
func BenchmarkUpdate(b *testing.B) {
	ctx := context.Background()
	pool, _ := testenv.PostgresSchema(b, 80)
	if _, err := pool.Exec(ctx, `CREATE TABLE counters (key text PRIMARY KEY, n bigint NOT NULL) WITH (fillfactor = 70);
INSERT INTO counters VALUES ('hot', 0)`); err != nil {
		b.Fatal(err)
	}
	backend, err := pgcas.NewBackend(pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := backend.CreateSchema(ctx); err != nil {
		b.Fatal(err)
	}
	store := func(b *testing.B, ev *events, opts ...cas.Option) *cas.Store[int64] {
		s, err := cas.NewStore[int64](backend, nil, append(opts, ev.observer(), cas.WithAttempts(100000))...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	incr := func(n int64) (int64, error) { return n + 1, nil }
	var keyN int
	fresh := func(b *testing.B, s *cas.Store[int64], n int) []string {
		keys := make([]string, n)
		for i := range keys {
			keyN++
			keys[i] = fmt.Sprint("k", keyN)
			if err := s.Create(ctx, keys[i], 0); err != nil {
				b.Fatal(err)
			}
		}
		return keys
	}

	type scenario struct {
		name string
		run  func(b *testing.B, clients int)
	}
	casScenario := func(name string, opts []cas.Option, per []cas.UpdateOption, perClientKey bool) scenario {
		return scenario{name, func(b *testing.B, clients int) {
			var ev events
			s := store(b, &ev, opts...)
			keys := fresh(b, s, clients)
			testenv.RunClients(b, clients, "updates", func(ctx context.Context, c int) error {
				k := keys[0]
				if perClientKey {
					k = keys[c]
				}
				_, err := s.Update(ctx, k, incr, per...)
				return err
			})
			s.Close() // the observer has every event
			commits := ev.count(cas.EventCommitted)
			b.ReportMetric(float64(commits+ev.count(cas.EventConflict))/float64(max(commits, 1)), "attempts/op")
		}}
	}
	scenarios := []scenario{
		{"bare", func(b *testing.B, clients int) {
			testenv.RunClients(b, clients, "updates", func(ctx context.Context, _ int) error {
				_, err := pool.Exec(ctx, `UPDATE counters SET n = n + 1 WHERE key = 'hot'`)
				return err
			})
		}},
		{"forupdate", func(b *testing.B, clients int) {
			testenv.RunClients(b, clients, "updates", func(ctx context.Context, _ int) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var n int64
					if err := tx.QueryRow(ctx, `SELECT n FROM counters WHERE key = 'hot' FOR UPDATE`).Scan(&n); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `UPDATE counters SET n = $1 WHERE key = 'hot'`, n+1)
					return err
				})
			})
		}},
		casScenario("raw", nil, []cas.UpdateOption{cas.NoCoalescing()}, false),
		casScenario("admission", []cas.Option{cas.WithCoalescing(false)}, nil, false),
		casScenario("combined", nil, nil, false),
		casScenario("manykeys", nil, []cas.UpdateOption{cas.NoCoalescing()}, true),
	}
	for _, sc := range scenarios {
		for _, clients := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("%s/clients=%d", sc.name, clients), func(b *testing.B) { sc.run(b, clients) })
		}
	}
}
