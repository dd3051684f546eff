package growth_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// fillRecords copies the record of key 'seed' (written through the Store)
// to $1 rows of random keys, live for a day more and expiring in the order
// they were written, as a day of traffic leaves them. Sorted by key, so the
// primary key is built in order.
const fillRecords = `INSERT INTO {{table}} (scope, key, fingerprint, terminal, result, created_at, expires_at)
SELECT 'bench', ` + randomKey + `, s.fingerprint, s.terminal, s.result,
       now() - ($1 - i) * interval '1 ms', now() + interval '1 day' - ($1 - i) * interval '1 ms'
FROM generate_series(1, $1) i, (SELECT * FROM {{table}} WHERE scope = 'bench' AND key = 'seed') s
ORDER BY 2`

// workingSet is how many keys the replay scenarios replay, written
// through the Store into both tables before the fill.
const workingSet = 1000

// BenchmarkGrowthIdempotency runs Store.Do and Store.Exec on a records
// table of NOLOCK_BENCH_ROWS records against the same on an empty one
// (x-empty, see testenv.Compare), clients goroutines each:
//
//	do           Do with a new random key (UUIDv4), fn writes nothing
//	do-v7        do with a new time-ordered key (UUIDv7): the new keys
//	             land together in one place of the keys' index, not on
//	             random pages of it
//	exec         Exec with a new random key, a one-row SELECT as the statement
//	replay       Do on one of workingSet keys Do stored: the stored result
//	exec-replay  Exec on one of workingSet keys Exec stored
//
// The effect is kept to nothing, so what is measured is the key's own
// cost: the part a larger table could make dearer.
func BenchmarkGrowthIdempotency(b *testing.B) {
	rows := testenv.BenchRows(b, defaultRows)
	g := testenv.NewGrowth(b, "idem", rows, clients+4)
	ctx := context.Background()
	stores := map[string]*idempotency.Store{}
	for _, table := range []string{g.Filled, g.Empty} {
		s, err := idempotency.New(g.Pool, idempotency.WithTable(table))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.CreateSchema(ctx); err != nil {
			b.Fatal(err)
		}
		stores[table] = s
		for i := range workingSet {
			if _, err := s.Do(ctx, "bench", fmt.Sprint("do-", i), nil, paid); err != nil {
				b.Fatal(err)
			}
			if _, err := s.Exec(ctx, "bench", fmt.Sprint("exec-", i), nil, execSQL, i); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := s.Do(ctx, "bench", "seed", nil, paid); err != nil {
			b.Fatal(err)
		}
	}
	g.Fill(b, g.Filled, g.Empty, fillRecords)
	type op = func(ctx context.Context, client int) error
	scenarios := []struct {
		name string
		op   func(s *idempotency.Store) op
	}{
		{"do", func(s *idempotency.Store) op {
			return func(ctx context.Context, _ int) error {
				res, err := s.Do(ctx, "bench", uuid.NewString(), nil, paid)
				return want(res, err, false)
			}
		}},
		{"do-v7", func(s *idempotency.Store) op {
			return func(ctx context.Context, _ int) error {
				res, err := s.Do(ctx, "bench", uuid.Must(uuid.NewV7()).String(), nil, paid)
				return want(res, err, false)
			}
		}},
		{"exec", func(s *idempotency.Store) op {
			return func(ctx context.Context, c int) error {
				res, err := s.Exec(ctx, "bench", uuid.NewString(), nil, execSQL, c)
				return want(res, err, false)
			}
		}},
		{"replay", func(s *idempotency.Store) op {
			return func(ctx context.Context, _ int) error {
				res, err := s.Do(ctx, "bench", fmt.Sprint("do-", rand.IntN(workingSet)), nil, paid)
				return want(res, err, true)
			}
		}},
		{"exec-replay", func(s *idempotency.Store) op {
			return func(ctx context.Context, c int) error {
				res, err := s.Exec(ctx, "bench", fmt.Sprint("exec-", rand.IntN(workingSet)), nil, execSQL, c)
				return want(res, err, true)
			}
		}},
	}
	for _, sc := range scenarios {
		b.Run(fmt.Sprintf("%s/rows=%d", sc.name, rows), func(b *testing.B) {
			testenv.Compare(b, clients, sc.op(stores[g.Filled]), sc.op(stores[g.Empty]))
		})
	}
}

// execSQL is Exec's statement in the benchmarks: one row, no table.
const execSQL = `SELECT $1::int AS client`

func paid(context.Context, pgx.Tx) ([]byte, error) { return []byte("paid"), nil }

// want checks that a call ran (replayed false) or replayed.
func want(res idempotency.Result, err error, replayed bool) error {
	if err == nil && res.Replayed != replayed {
		err = fmt.Errorf("replayed %v, want %v", res.Replayed, replayed)
	}
	return err
}
