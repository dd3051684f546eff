package partition_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/partition"
)

// One member, two partitions: every message applied once, in order, the
// stored offsets at the end of each partition, and (KafkaCommitInterval)
// the same offsets committed to Kafka for lag tools.
func TestConsumeOneMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, per = 2, 120
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, per)
	cfg := b.config("a", nil)
	cfg.KafkaCommitInterval = time.Nanosecond // after every batch
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, parts*per); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	tl, err := count(ctx, b.pool, parts, per)
	if err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || tl.rows != parts*per {
		t.Fatalf("results: %v; want %d rows, each offset once, in order", tl, parts*per)
	}
	for p := 0; p < parts; p++ {
		r, err := readRow(ctx, b.pool, b.group, b.topic, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.next == nil || *r.next != per || r.epoch < 1 {
			t.Fatalf("partition %d row: %+v, want next offset %d and an epoch", p, r, per)
		}
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: b.group, Topics: map[string][]int{b.topic: {0, 1}}})
	if err != nil || res.Error != nil {
		t.Fatalf("offset fetch: %v %v", err, res.Error)
	}
	for _, p := range res.Topics[b.topic] {
		if p.CommittedOffset != per {
			t.Fatalf("Kafka's committed offset for partition %d: %d, want %d", p.Partition, p.CommittedOffset, per)
		}
	}
}

// Members join and leave while four partitions are consumed and more is
// produced: each rebalance ends the generation's workers, the new owners
// claim, and every offset lands once, in order. Each partition's epoch
// ends at exactly its number of granted claims, and the epochs in results
// never go down along a partition.
func TestRebalances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, per = 4, 150
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, per/2)
	var claims [parts]atomic.Int64
	slow := func(name string) partition.Config {
		rec := record(name)
		cfg := b.config(name, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			time.Sleep(5 * time.Millisecond) // keep work in flight across rebalances
			return rec(ctx, tx, msgs)
		})
		cfg.OnClaim = func(cl partition.Claim) { claims[cl.Partition].Add(1) }
		return cfg
	}
	m1 := startMember(t, b.pool, slow("m1"))
	if err := waitRows(ctx, b.pool, 60); err != nil {
		t.Fatal(err)
	}
	m2 := startMember(t, b.pool, slow("m2"))
	if err := waitRows(ctx, b.pool, 150); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, parts, per/2, per/2)
	m3 := startMember(t, b.pool, slow("m3"))
	if err := waitRows(ctx, b.pool, 250); err != nil {
		t.Fatal(err)
	}
	if err := m1.stop(); err != nil {
		t.Fatalf("m1: %v", err)
	}
	if err := waitRows(ctx, b.pool, parts*per); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*member{m2, m3} {
		if err := m.stop(); err != nil {
			t.Fatal(err)
		}
	}
	var rows, dups, reordered, epochDown int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(*) - count(DISTINCT (partition_id, msg_offset)),
		count(*) FILTER (WHERE msg_offset < prev_off), count(*) FILTER (WHERE epoch < prev_epoch)
		FROM (SELECT *, lag(msg_offset) OVER w AS prev_off, lag(epoch) OVER w AS prev_epoch
		      FROM results WINDOW w AS (PARTITION BY partition_id ORDER BY seq)) x`).Scan(&rows, &dups, &reordered, &epochDown); err != nil {
		t.Fatal(err)
	}
	if rows != parts*per || dups != 0 || reordered != 0 || epochDown != 0 {
		t.Fatalf("results: %d rows (want %d), %d duplicates, %d out of order, %d epochs going down", rows, parts*per, dups, reordered, epochDown)
	}
	if tl, err := count(ctx, b.pool, parts, per); err != nil || !tl.exact() {
		t.Fatalf("results: %v (%v)", tl, err)
	}
	total := int64(0)
	for p := 0; p < parts; p++ {
		r, err := readRow(ctx, b.pool, b.group, b.topic, p)
		if err != nil {
			t.Fatal(err)
		}
		if r.epoch != claims[p].Load() || r.next == nil || *r.next != per {
			t.Fatalf("partition %d: row %+v after %d claims; want epoch = claims, next offset %d", p, r, claims[p].Load(), per)
		}
		total += r.epoch
	}
	t.Logf("%d claims over %d partitions, %d rows exact", total, parts, rows)
}

// Stopping Run lets the batch in flight commit, then returns nil after
// every worker released.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 5)
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		once.Do(func() { close(entered); <-proceed })
		return rec(ctx, tx, msgs)
	})
	var released atomic.Int32
	cfg.OnRelease = func(_ partition.Claim, err error) {
		if err == nil {
			released.Add(1)
		}
	}
	c, err := partition.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("no batch started")
	}
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a batch was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(proceed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the batch finished")
	}
	tl, err := count(ctx, b.pool, 1, 5)
	if err != nil {
		t.Fatal(err)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tl.rows == 0 || tl.dups != 0 || r.next == nil || *r.next != int64(tl.rows) || released.Load() != 1 {
		t.Fatalf("after shutdown: results %v, row %+v, %d releases; want the batch in flight committed, offset after it, one release", tl, r, released.Load())
	}
}

// A transaction whose connection dies (here: the handler's backend is
// terminated, SQLSTATE 57P01) is retried inside the worker: same claim, no
// new generation, every offset once.
func TestTransientErrorRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const per = 40
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, per)
	var calls, kills atomic.Int32
	var claims atomic.Int32
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if calls.Add(1)%2 == 1 && kills.Load() < 3 {
			kills.Add(1)
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return rec(ctx, tx, msgs)
	})
	cfg.OnClaim = func(partition.Claim) { claims.Add(1) }
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, per); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	tl, err := count(ctx, b.pool, 1, per)
	if err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || claims.Load() != 1 || kills.Load() != 3 {
		t.Fatalf("results %v after %d backend kills and %d claims; want exact, 3 kills, 1 claim", tl, kills.Load(), claims.Load())
	}
}

// A handler that keeps failing with its own error stops Run after
// MaxAttempts tries of the batch, returning the error; nothing is stored.
func TestHandlerErrorStopsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 3)
	poison := errors.New("poison message")
	var calls atomic.Int32
	cfg := b.config("m", func(context.Context, pgx.Tx, []kafka.Message) error {
		calls.Add(1)
		return poison
	})
	cfg.MaxAttempts = 3
	var released error
	cfg.OnRelease = func(_ partition.Claim, err error) { released = err }
	c, err := partition.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = c.Run(runCtx)
	if !errors.Is(err, poison) || runCtx.Err() != nil {
		t.Fatalf("Run: %v; want the handler's error before the deadline", err)
	}
	if calls.Load() != 3 || !errors.Is(released, poison) {
		t.Fatalf("%d handler calls, release %v; want 3 and the error", calls.Load(), released)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.next != nil {
		t.Fatalf("stored offset %d after failed batches, want none", *r.next)
	}
}

// A handler that panics on every call: the panic is recovered as a
// *PanicError counted toward MaxAttempts, Run returns it, and nothing is
// written. Before, the panic ended the test binary.
func TestHandlerPanicStopsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 3)
	var calls atomic.Int32
	cfg := b.config("m", func(context.Context, pgx.Tx, []kafka.Message) error {
		calls.Add(1)
		panic("poison message")
	})
	cfg.MaxAttempts = 2
	c, err := partition.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = c.Run(runCtx)
	var pe *partition.PanicError
	if !errors.As(err, &pe) || pe.Value != "poison message" || len(pe.Stack) == 0 || runCtx.Err() != nil {
		t.Fatalf("Run: %v; want the handler's panic before the deadline", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d handler calls, want 2 (MaxAttempts)", n)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.next != nil {
		t.Fatalf("stored offset %d after panicking batches, want none", *r.next)
	}
	var rows int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("results holds %d rows (%v), want 0", rows, err)
	}
}

// A handler statement that always hits statement_timeout (57014) counts
// toward MaxAttempts: Run returns the error after two handler calls.
// Before, 57014 and 55P03 were transient wherever they came from, and the
// batch was retried for as long as the generation lasted.
func TestHandlerStatementTimeoutStopsRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 3)
	var calls atomic.Int32
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, _ []kafka.Message) error {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '20ms'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(0.2)`)
		return err
	})
	cfg.MaxAttempts = 2
	c, err := partition.New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for calls.Load() <= 5 {
		select {
		case err = <-done:
		case <-time.After(10 * time.Millisecond):
			continue
		}
		break
	}
	if err == nil {
		cancel()
		<-done
		t.Fatalf("%d handler calls and Run goes on; want it to stop after MaxAttempts", calls.Load())
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57014" || runCtx.Err() != nil {
		t.Fatalf("Run: %v; want the statement timeout before the deadline", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d handler calls, want 2 (MaxAttempts)", n)
	}
}
