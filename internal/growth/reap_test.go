package growth_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// A retention case: a table filled with expired rows, the writes that
// keep coming meanwhile, and the call that deletes the expired rows.
type retention struct {
	name string
	// table is the filled table's name, given the prefix the case's
	// pattern was given; fill fills it with $1 rows, all expired.
	table func(prefix string) string
	fill  string
	// open returns, on pool and tables named after prefix, a write (one
	// call of the pattern) and the reap (Reap or PurgeParkedOlderThan
	// with batch), and creates the tables.
	open func(t testing.TB, pool *pgxpool.Pool, prefix string, batch int) (write op, reap func(ctx context.Context) (int64, error))
	// lock is a statement that locks one expired row (FOR UPDATE).
	lock string
}

var retentions = []retention{
	{
		name:  "idempotency",
		table: func(p string) string { return p },
		fill: `INSERT INTO {{table}} (scope, key, fingerprint, terminal, result, created_at, expires_at)
SELECT 'bench', ` + randomKey + `, '', false, 'paid', now() - interval '2 days', now() - interval '1 day' - ($1 - i) * interval '1 ms'
FROM generate_series(1, $1) i ORDER BY 2`,
		open: func(t testing.TB, pool *pgxpool.Pool, prefix string, batch int) (op, func(context.Context) (int64, error)) {
			s, err := idempotency.New(pool, idempotency.WithTable(prefix))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.CreateSchema(context.Background()); err != nil {
				t.Fatal(err)
			}
			write := func(ctx context.Context, _ int) error {
				_, err := s.Do(ctx, "bench", uuid.NewString(), nil, paid)
				return err
			}
			return write, func(ctx context.Context) (int64, error) { return s.Reap(ctx, batch) }
		},
		lock: `SELECT 1 FROM {{table}} WHERE expires_at <= now() ORDER BY expires_at LIMIT 1 FOR UPDATE`,
	},
	{
		name:  "inbox",
		table: func(p string) string { return p },
		fill: `INSERT INTO {{table}} (consumer, id, processed_at)
SELECT 'bench', ` + randomKey + `, now() - interval '2 days' - ($1 - i) * interval '1 ms' FROM generate_series(1, $1) i ORDER BY 2`,
		open: func(t testing.TB, pool *pgxpool.Pool, prefix string, batch int) (op, func(context.Context) (int64, error)) {
			in := openInbox(t, pool, prefix)
			return processOne(in), func(ctx context.Context) (int64, error) { return in.Reap(ctx, 24*time.Hour, batch) }
		},
		lock: `SELECT 1 FROM {{table}} WHERE processed_at < now() - interval '1 day' ORDER BY processed_at LIMIT 1 FOR UPDATE`,
	},
	{
		name:  "parked",
		table: func(p string) string { return p + "_parked" },
		fill: `INSERT INTO {{table}} (group_id, topic, partition_id, "offset", key, value, headers, error, attempts, parked_at)
SELECT 'bench', 'orders', i % 8, i, 'k', convert_to(repeat('v', 200), 'UTF8'), '[{"key":"id","value":"x"}]', 'handler: failed', 10,
       now() - interval '40 days' - ($1 - i) * interval '1 ms'
FROM generate_series(1, $1) i ORDER BY 2, 3, 4`,
		open: func(t testing.TB, pool *pgxpool.Pool, prefix string, batch int) (op, func(context.Context) (int64, error)) {
			in := openInbox(t, pool, prefix)
			return processOne(in), func(ctx context.Context) (int64, error) {
				return in.PurgeParkedOlderThan(ctx, 30*24*time.Hour, batch)
			}
		},
		lock: `SELECT 1 FROM {{table}} ORDER BY parked_at LIMIT 1 FOR UPDATE`,
	},
}

func openInbox(t testing.TB, pool *pgxpool.Pool, prefix string) *inbox.Inbox {
	in, err := inbox.New(pool, "bench", inbox.WithTable(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close() })
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	return in
}

// processOne processes one message with a new id, its handler writing
// nothing.
func processOne(in *inbox.Inbox) op {
	return func(ctx context.Context, c int) error {
		m := kafka.Message{Topic: "bench", Partition: c, Headers: []kafka.Header{{Key: "id", Value: []byte(uuid.NewString())}}}
		_, err := in.Process(ctx, []kafka.Message{m}, func(context.Context, pgx.Tx, kafka.Message) error { return nil })
		return err
	}
}

// deletes records, per DELETE statement run on a traced pool, the rows it
// deleted, and per transaction the DELETE statements in it.
type deletes struct {
	mu      sync.Mutex
	rows    []int64
	inTx    map[*pgx.Conn]int // DELETEs since the connection's BEGIN, while a transaction is open
	mostTx  int               // the most DELETEs one transaction ran
	started map[*pgx.Conn]string
}

func (d *deletes) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.started[conn] = data.SQL
	return ctx
}

func (d *deletes) TraceQueryEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sql := strings.TrimSpace(d.started[conn])
	switch {
	case data.Err != nil:
	case strings.Contains(sql, "DELETE FROM"): // a reap, whichever form it takes
		d.rows = append(d.rows, data.CommandTag.RowsAffected())
		if _, open := d.inTx[conn]; open {
			d.inTx[conn]++
		}
		d.mostTx = max(d.mostTx, d.inTx[conn], 1)
	case strings.HasPrefix(strings.ToLower(sql), "begin"):
		d.inTx[conn] = 0
	case strings.HasPrefix(strings.ToLower(sql), "commit"), strings.HasPrefix(strings.ToLower(sql), "rollback"):
		delete(d.inTx, conn)
	}
}

// TestReapBounded fills each table with rows expired rows, locks one of
// them in a transaction of the test's own, and reaps with batch: the reap
// must finish while that lock is held (it skips the locked row rather than
// wait for it), delete every other expired row and none of the live ones
// written meanwhile, and no DELETE statement may delete more than batch
// rows or share its transaction with another.
func TestReapBounded(t *testing.T) {
	const rows, batch = 2_000, 150
	for _, rc := range retentions {
		t.Run(rc.name, func(t *testing.T) {
			t.Parallel()
			_, schema := testenv.PostgresSchema(t, 1)
			d := &deletes{inTx: map[*pgx.Conn]int{}, started: map[*pgx.Conn]string{}}
			pool := testenv.PoolWith(t, testenv.PostgresDSNFor(t, schema), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.Tracer = d
				cfg.MaxConns = 4
			})
			g := &testenv.Growth{Pool: pool, Schema: schema, Rows: rows}
			write, reap := rc.open(t, pool, "r", batch)
			table := rc.table("r")
			g.Fill(t, table, "", rc.fill)
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
			defer cancel()
			for c := range 10 { // live rows, which stay
				if err := write(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			locker, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer locker.Rollback(context.Background())
			if _, err := locker.Exec(ctx, strings.ReplaceAll(rc.lock, "{{table}}", pgx.Identifier{table}.Sanitize())); err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			d.rows, d.mostTx = nil, 0
			d.mu.Unlock()
			n, err := reap(ctx) // with the lock still held
			if err != nil {
				t.Fatalf("reap while one expired row is locked: %v", err)
			}
			if err := locker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			var left int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&left); err != nil {
				t.Fatal(err)
			}
			live := int64(10)
			if rc.name == "parked" {
				live = 0 // the writes add ids, not parked messages
			}
			if n != rows-1 || left != live+1 {
				t.Errorf("reaped %d of %d expired rows, %d rows left; want %d reaped and %d left (the locked one and %d live)", n, rows, left, rows-1, live+1, live)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if len(d.rows) < (rows-1)/batch {
				t.Errorf("%d DELETE statements deleted %d rows in batches of %d: want at least %d", len(d.rows), n, batch, (rows-1)/batch)
			}
			for i, r := range d.rows {
				if r > batch {
					t.Errorf("DELETE %d deleted %d rows, above the batch of %d", i, r, batch)
				}
			}
			if d.mostTx > 1 {
				t.Errorf("a transaction ran %d of the reap's DELETEs: want each its own", d.mostTx)
			}
		})
	}
}

// errReaped stops the writers once the reap has returned.
var errReaped = errors.New("reaped")

// writers is how many clients write while BenchmarkReap reaps.
const writers = 64

// BenchmarkReap fills each table with NOLOCK_BENCH_ROWS expired rows
// (10^6 in the figures) and reaps them in batches of 1,000 while 64
// clients write to the same tables (idempotency: Do with new keys; inbox
// and parked: Process of new ids), and reports the writers' p99 while the
// reap runs (p99-reap-ms) and without it (p99-ms: the mean of the p99 of
// as many writes just before and just after it), their ratio x-p99, the
// reap's duration (reap-s) and rows it deleted (reaped). The work is done
// once: run it with -benchtime 1x.
func BenchmarkReap(b *testing.B) {
	rows := testenv.BenchRows(b, defaultRows)
	for _, rc := range retentions {
		b.Run(fmt.Sprintf("%s/rows=%d", rc.name, rows), func(b *testing.B) {
			g := testenv.NewGrowth(b, "reap", rows, writers+8)
			write, reap := rc.open(b, g.Pool, "reap", 1000)
			g.Fill(b, rc.table("reap"), "", rc.fill)
			ctx := context.Background()
			run := func(limit int64, op op) services.Run {
				r, err := services.RunClients(ctx, writers, limit, 0, op)
				if err != nil && !errors.Is(err, errReaped) {
					b.Fatal(err)
				}
				return r
			}
			run(writers*10, write) // every connection open, every statement prepared
			const before = writers * 50
			quiet := run(before, write)
			done := make(chan struct{})
			var reaped int64
			var reapErr error
			start := time.Now()
			var took time.Duration
			go func() {
				defer close(done)
				reaped, reapErr = reap(ctx)
				took = time.Since(start)
			}()
			during := run(1<<62, func(ctx context.Context, c int) error {
				select {
				case <-done:
					return errReaped
				default:
					return write(ctx, c)
				}
			})
			<-done
			if reapErr != nil {
				b.Fatal(reapErr)
			}
			after := run(before, write)
			without := (quiet.P99 + after.P99) / 2
			b.ReportMetric(ms(without), "p99-ms")
			b.ReportMetric(ms(during.P99), "p99-reap-ms")
			b.ReportMetric(during.P99.Seconds()/without.Seconds(), "x-p99")
			b.ReportMetric(took.Seconds(), "reap-s")
			b.ReportMetric(float64(reaped), "reaped")
			b.Logf("%s: reaped %d rows in %v while %d writers made %d writes (p99 %v; %v and %v in %d writes before and after)",
				rc.name, reaped, took.Round(time.Millisecond), writers, during.Ops, during.P99, quiet.P99, after.P99, before)
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
