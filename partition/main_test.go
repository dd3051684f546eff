package partition_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

func TestMain(m *testing.M) {
	// pgxpool's background health check ends when the pool closes, which
	// testenv does in a cleanup; ignore it only while it winds down.
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres, testenv.EnvKafka), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Group timings for tests: the broker's minimum session timeout is 6 s;
// fast heartbeats make rebalances quick.
const (
	testHeartbeat    = 200 * time.Millisecond
	testSession      = 6 * time.Second
	testRebalance    = 3 * time.Second
	testBatchTimeout = 2 * time.Second
	testMaxBatch     = 10
)

// bed is one test's world: a fresh topic, a fresh schema with the
// partitions and results tables, and a fresh group name.
type bed struct {
	brokers []string
	topic   string
	group   string
	schema  string
	pool    *pgxpool.Pool
}

func newBed(t testing.TB, partitions int) *bed {
	t.Helper()
	pool, schema := testenv.PostgresSchema(t, 16)
	return newBedOn(t, partitions, pool, schema)
}

// newBedOn is newBed on pool, whose search_path is schema.
func newBedOn(t testing.TB, partitions int, pool *pgxpool.Pool, schema string) *bed {
	t.Helper()
	brokers, topic := testenv.Topic(t, partitions)
	b := &bed{brokers: brokers, topic: topic, group: testenv.Name("g"), schema: schema, pool: pool}
	ctx := context.Background()
	c, err := newConsumer(pool, b.config("setup", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE results (
		seq bigserial PRIMARY KEY, topic text NOT NULL, partition_id int NOT NULL,
		msg_offset bigint NOT NULL, value text NOT NULL, epoch bigint NOT NULL, member text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return b
}

// spec is what a test gives New and Run: the group, the handler and the
// options, later options winning over earlier ones.
type spec struct {
	brokers, topics []string
	group           string
	handler         partition.Handler
	opts            []partition.Option
}

// with adds opts after s's own.
func (s *spec) with(opts ...partition.Option) { s.opts = append(slices.Clip(s.opts), opts...) }

// newConsumer is partition.New with s's group and options.
func newConsumer(db partition.DB, s spec) (*partition.Consumer, error) {
	return partition.New(db, s.brokers, s.group, s.topics, s.opts...)
}

// config is the tests' spec for member name, recording each message in
// results (see record) unless h is given.
func (b *bed) config(member string, h partition.Handler) spec {
	if h == nil {
		h = record(member)
	}
	return spec{brokers: b.brokers, group: b.group, topics: []string{b.topic}, handler: h, opts: []partition.Option{
		partition.WithMaxBatch(testMaxBatch), partition.WithHeartbeatInterval(testHeartbeat), partition.WithSessionTimeout(testSession),
		partition.WithRebalanceTimeout(testRebalance), partition.WithJoinGroupBackoff(200 * time.Millisecond),
		partition.WithBatchTimeout(testBatchTimeout), partition.WithLogger(testLogger(member)),
		partition.WithBackoff(10*time.Millisecond, time.Second),
	}}
}

// testLogger logs to stderr under NOLOCK_PARTITION_LOG=1 (a child's
// stderr lands in the parent's test log), and nowhere otherwise.
func testLogger(member string) *slog.Logger {
	if os.Getenv("NOLOCK_PARTITION_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("member", member)
}

// record returns a Handler that inserts one results row per message, in
// the fenced transaction, with the claim's epoch (0 outside a Consumer:
// the benchmark's baseline) and the member's name.
func record(member string) partition.Handler {
	return func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		cl, _ := partition.FromContext(ctx)
		parts := make([]int32, len(msgs))
		offs := make([]int64, len(msgs))
		vals := make([]string, len(msgs))
		for i, m := range msgs {
			parts[i], offs[i], vals[i] = int32(m.Partition), m.Offset, string(m.Value)
		}
		_, err := tx.Exec(ctx, `INSERT INTO results (topic, partition_id, msg_offset, value, epoch, member)
			SELECT $1, p, o, v, $2, $3 FROM unnest($4::int[], $5::bigint[], $6::text[]) AS u(p, o, v) ORDER BY o`,
			msgs[0].Topic, cl.Epoch, member, parts, offs, vals)
		return err
	}
}

// produce writes n messages to each partition of topic, in order, with
// the values "p-j" for j from first: the values the partition's offsets
// will have if every earlier message was produced the same way.
func produce(t testing.TB, brokers []string, topic string, partitions, first, n int) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll,
		BatchSize: 1000, BatchTimeout: 5 * time.Millisecond, MaxAttempts: 1,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { n, _ := strconv.Atoi(string(m.Key)); return n }),
	}
	defer w.Close()
	msgs := make([]kafka.Message, 0, partitions*n)
	for j := first; j < first+n; j++ {
		for p := 0; p < partitions; p++ {
			msgs = append(msgs, kafka.Message{Key: []byte(strconv.Itoa(p)), Value: fmt.Appendf(nil, "%d-%d", p, j)})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// tally counts what results holds against what was produced.
type tally struct {
	rows      int // rows in results
	dups      int // rows for an offset already applied
	reordered int // rows whose offset is below an earlier row's, same partition
	missing   int // produced offsets never applied
	badValue  int // rows whose value is not the message at that offset
}

func (t tally) exact() bool {
	return t.dups == 0 && t.reordered == 0 && t.missing == 0 && t.badValue == 0
}

func (t tally) String() string {
	return fmt.Sprintf("%d rows, %d duplicates, %d out of order, %d missing, %d wrong values", t.rows, t.dups, t.reordered, t.missing, t.badValue)
}

// count reads results in commit order (seq: each partition's transactions
// run one at a time under the fence) and tallies it.
func count(ctx context.Context, pool *pgxpool.Pool, partitions, perPartition int) (tally, error) {
	each, err := countEach(ctx, pool, partitions, perPartition)
	var tl tally
	for _, e := range each {
		tl.rows += e.rows
		tl.dups += e.dups
		tl.reordered += e.reordered
		tl.missing += e.missing
		tl.badValue += e.badValue
	}
	return tl, err
}

// countEach is count for each partition on its own.
func countEach(ctx context.Context, pool *pgxpool.Pool, partitions, perPartition int) ([]tally, error) {
	rows, err := pool.Query(ctx, `SELECT partition_id, msg_offset, value FROM results ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	each := make([]tally, partitions)
	seen := make([]map[int64]bool, partitions)
	last := make([]int64, partitions)
	for p := range seen {
		seen[p], last[p] = map[int64]bool{}, -1
	}
	for rows.Next() {
		var p int
		var off int64
		var val string
		if err := rows.Scan(&p, &off, &val); err != nil {
			return nil, err
		}
		tl := &each[p]
		tl.rows++
		if seen[p][off] {
			tl.dups++
		}
		if off < last[p] {
			tl.reordered++
		}
		if val != fmt.Sprintf("%d-%d", p, off) {
			tl.badValue++
		}
		seen[p][off], last[p] = true, max(last[p], off)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for p := range seen {
		for off := int64(0); off < int64(perPartition); off++ {
			if !seen[p][off] {
				each[p].missing++
			}
		}
	}
	return each, nil
}

// waitRows waits until results holds at least n rows (testenv.Poll: for
// at most a minute, scaled; it may run on any goroutine).
func waitRows(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var got int
	err := testenv.Poll(fmt.Sprintf("results holding %d rows", n), func() (bool, error) {
		err := pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&got)
		return got >= n, err
	})
	if err != nil {
		return fmt.Errorf("%w (it holds %d)", err, got)
	}
	return nil
}

// member runs a Consumer in the background until stop is called; stop
// returns Run's error.
type member struct {
	c    *partition.Consumer
	stop func() error
}

func startMember(t testing.TB, pool *pgxpool.Pool, cfg spec) *member {
	t.Helper()
	c, err := newConsumer(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return runMember(t, c, cfg.handler)
}

// runMember runs c with h in the background until stop is called (or the
// test ends).
func runMember(t testing.TB, c *partition.Consumer, h partition.Handler) *member {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	var once sync.Once
	var res error
	stop := func() error {
		once.Do(func() {
			cancel()
			res = <-done
		})
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return &member{c: c, stop: stop}
}

// row is the partitions table's row for one partition.
type row struct {
	epoch      int64
	generation int32
	member     string
	next       *int64
}

func readRow(ctx context.Context, pool *pgxpool.Pool, group, topic string, p int) (row, error) {
	var r row
	err := pool.QueryRow(ctx, `SELECT epoch, generation, member_id, next_offset FROM `+partition.DefaultTable+
		` WHERE group_id = $1 AND topic = $2 AND partition_id = $3`, group, topic, p).Scan(&r.epoch, &r.generation, &r.member, &r.next)
	return r, err
}
