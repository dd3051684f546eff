package growth_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

type op = func(ctx context.Context, client int) error

// BenchmarkGrowthInbox runs Inbox.Process on one message with a new
// random id (a UUIDv4; a handler that writes nothing) against an inbox
// whose ids table holds NOLOCK_BENCH_ROWS random ids, and the same on an
// empty one (process); then the same comparison for the id's bare insert
// into those tables (insert): what the database charges any design that
// keeps these ids in a B-tree.
func BenchmarkGrowthInbox(b *testing.B) {
	benchInbox(b, uuid.NewString, randomKey)
}

// BenchmarkGrowthInboxV7 is BenchmarkGrowthInbox with time-ordered ids
// (UUIDv7), the filled table's older than every new one: each new id goes
// to the right edge of the primary key, not to a random page of it.
func BenchmarkGrowthInboxV7(b *testing.B) {
	benchInbox(b, func() string { return uuid.Must(uuid.NewV7()).String() },
		// a UUIDv7 of i milliseconds after 2020-09-13, then md5's digits
		`(SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || substr(md5(i::text)::uuid::text, 14)
  FROM (SELECT lpad(to_hex(1600000000000 + i), 12, '0') AS h) t)`)
}

func benchInbox(b *testing.B, newID func() string, filledID string) {
	rows := testenv.BenchRows(b, defaultRows)
	g := testenv.NewGrowth(b, "inbox", rows, clients+4)
	ops := map[string]op{}
	for _, table := range []string{g.Filled, g.Empty} {
		in, err := inbox.New(g.Pool, "bench", inbox.WithTable(table))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { in.Close() })
		if err := in.CreateSchema(context.Background()); err != nil {
			b.Fatal(err)
		}
		ops[table] = func(ctx context.Context, c int) error {
			m := kafka.Message{Topic: "bench", Partition: c, Headers: []kafka.Header{{Key: "id", Value: []byte(newID())}}}
			out, err := in.Process(ctx, []kafka.Message{m}, func(context.Context, pgx.Tx, kafka.Message) error { return nil })
			if err == nil && out.Processed != 1 {
				err = fmt.Errorf("processed %d, want 1", out.Processed)
			}
			return err
		}
	}
	g.Fill(b, g.Filled, g.Empty, `INSERT INTO {{table}} (consumer, id, processed_at)
SELECT 'bench', `+filledID+`, now() - ($1 - i) * interval '1 ms' FROM generate_series(1, $1) i ORDER BY 2`)
	b.Run(fmt.Sprintf("process/rows=%d", rows), func(b *testing.B) {
		testenv.Compare(b, clients, ops[g.Filled], ops[g.Empty])
	})
	// The least any inbox keyed by these ids pays as its table grows: the
	// id's insert alone, committed on its own, no library.
	insert := func(table string) op {
		sql := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (consumer, id) VALUES ('bench', $1)`
		return func(ctx context.Context, _ int) error {
			_, err := g.Pool.Exec(ctx, sql, newID())
			return err
		}
	}
	b.Run(fmt.Sprintf("insert/rows=%d", rows), func(b *testing.B) {
		testenv.Compare(b, clients, insert(g.Filled), insert(g.Empty))
	})
}

// BenchmarkGrowthHolds runs Holds.Hold and Release of a resource of the
// client's own on a holds table of NOLOCK_BENCH_ROWS resources (a third
// free, a third held, a third confirmed), and the same on a table of the
// clients' resources alone. The clients' resources are added after the
// fill in both, so that in both they share the heap's last pages: added
// first, they would share one page in the empty table and be spread over
// the filled one, whose page contention differs.
func BenchmarkGrowthHolds(b *testing.B) {
	rows := testenv.BenchRows(b, defaultRows)
	g := testenv.NewGrowth(b, "holds", rows, clients+4)
	ops := map[string]op{}
	var adds []func() // the rows the clients use, added after the fill in both tables
	for _, table := range []string{g.Filled, g.Empty} {
		h, err := conditional.NewHolds(g.Pool, conditional.WithTable(table))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { h.Close() })
		if err := h.CreateSchema(context.Background()); err != nil {
			b.Fatal(err)
		}
		adds = append(adds, func() {
			for c := range clients {
				if err := h.Add(context.Background(), fmt.Sprint("seat-", c)); err != nil {
					b.Fatal(err)
				}
			}
		})
		ops[table] = func(ctx context.Context, c int) error {
			seat, holder := fmt.Sprint("seat-", c), strconv.Itoa(c)
			if _, err := h.Hold(ctx, seat, holder, time.Minute); err != nil {
				return err
			}
			return h.Release(ctx, seat, holder)
		}
	}
	g.Fill(b, g.Filled, g.Empty, `INSERT INTO {{table}} (resource, state, holder, hold_until)
SELECT `+randomKey+`, s.state, CASE WHEN s.state <> 'free' THEN 'h' || i END, CASE WHEN s.state = 'held' THEN now() + interval '1 hour' END
FROM generate_series(1, $1) i, LATERAL (SELECT (ARRAY['free', 'held', 'confirmed'])[i % 3 + 1] AS state) s ORDER BY 1`)
	for _, add := range adds {
		add()
	}
	b.Run(fmt.Sprintf("hold-release/rows=%d", rows), func(b *testing.B) {
		testenv.Compare(b, clients, ops[g.Filled], ops[g.Empty])
	})
}

// BenchmarkGrowthStock runs Stock.Take of one unit of one key from clients
// goroutines on a stock table of NOLOCK_BENCH_ROWS keys (10^6 in the
// figures), and the same on a table of that key alone.
func BenchmarkGrowthStock(b *testing.B) {
	rows := testenv.BenchRows(b, defaultRows)
	g := testenv.NewGrowth(b, "stock", rows, clients+4)
	ops := map[string]op{}
	var adds []func() // the rows the clients use, added after the fill in both tables
	for _, table := range []string{g.Filled, g.Empty} {
		s, err := conditional.NewStock(g.Pool, conditional.WithTable(table))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if err := s.CreateSchema(context.Background()); err != nil {
			b.Fatal(err)
		}
		adds = append(adds, func() {
			if err := s.Put(context.Background(), "hot", 1e15); err != nil {
				b.Fatal(err)
			}
		})
		ops[table] = func(ctx context.Context, _ int) error { return s.Take(ctx, "hot", 1) }
	}
	g.Fill(b, g.Filled, g.Empty, `INSERT INTO {{table}} (key, bucket, qty)
SELECT `+randomKey+`, 0, 1000 FROM generate_series(1, $1) i ORDER BY 1`)
	for _, add := range adds {
		add()
	}
	b.Run(fmt.Sprintf("take/rows=%d", rows), func(b *testing.B) {
		testenv.Compare(b, clients, ops[g.Filled], ops[g.Empty])
	})
}

// BenchmarkGrowthLease runs lease Acquire and Release of a key of the
// client's own on a lease table of NOLOCK_BENCH_ROWS lock rows (10^6 in
// the figures; released, as the rows of past locks stay), and the same on
// a table of the clients' keys alone.
func BenchmarkGrowthLease(b *testing.B) {
	rows := testenv.BenchRows(b, defaultRows)
	g := testenv.NewGrowth(b, "lease", rows, clients+4)
	ops := map[string]op{}
	for _, table := range []string{g.Filled, g.Empty} {
		l, err := lease.New(g.Pool, lease.WithTable(table), lease.WithLease(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		if err := l.CreateSchema(context.Background()); err != nil {
			b.Fatal(err)
		}
		ops[table] = func(ctx context.Context, c int) error {
			lock, err := l.Acquire(ctx, fmt.Sprint("job-", c))
			if err != nil {
				return err
			}
			return lock.Release(ctx)
		}
	}
	g.Fill(b, g.Filled, g.Empty, `INSERT INTO {{table}} (key, owner, nonce, token, expires_at, released)
SELECT `+randomKey+`, 'gone', md5(i::text), i % 100 + 1, now() - interval '1 hour', true FROM generate_series(1, $1) i ORDER BY 1`)
	b.Run(fmt.Sprintf("acquire-release/rows=%d", rows), func(b *testing.B) {
		testenv.Compare(b, clients, ops[g.Filled], ops[g.Empty])
	})
}
