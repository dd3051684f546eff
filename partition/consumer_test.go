package partition_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
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
	cfg.with(partition.WithKafkaCommitInterval(time.Nanosecond)) // after every batch
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
// ends between its number of granted claims and its number of workers
// (each worker is released once, claimed or not: a claim whose commit
// outcome was unknown when its generation ended may have taken an epoch
// without being granted), and the epochs in results never go down along
// a partition.
func TestRebalances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, per = 4, 150
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, per/2)
	var claims, workers [parts]atomic.Int64
	slow := func(name string) spec {
		rec := record(name)
		cfg := b.config(name, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			time.Sleep(5 * time.Millisecond) // keep work in flight across rebalances
			return rec(ctx, tx, msgs)
		})
		cfg.with(partition.WithOnClaim(func(cl partition.Claim) { claims[cl.Partition].Add(1) }))
		cfg.with(partition.WithOnRelease(func(cl partition.Claim, _ error) { workers[cl.Partition].Add(1) }))
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
		if r.epoch < claims[p].Load() || r.epoch > workers[p].Load() || r.next == nil || *r.next != per {
			t.Fatalf("partition %d: row %+v after %d claims by %d workers; want claims <= epoch <= workers, next offset %d", p, r, claims[p].Load(), workers[p].Load(), per)
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
	cfg.with(partition.WithOnRelease(func(_ partition.Claim, err error) {
		if err == nil {
			released.Add(1)
		}
	}))
	c, err := newConsumer(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, cfg.handler) }()
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
	cfg.with(partition.WithOnClaim(func(partition.Claim) { claims.Add(1) }))
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

// A handler that keeps failing with its own error: each message is tried
// MaxAttempts times on its own and parked, in offset order, with the
// partition's stored offset moved past it; Run goes on and returns nil
// when stopped; the worker was never released with an error.
func TestHandlerErrorParks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 3)
	poison := errors.New("poison message")
	cfg := b.config("m", func(context.Context, pgx.Tx, []kafka.Message) error { return poison })
	cfg.with(partition.WithAttempts(3))
	var releasedErr atomic.Bool
	cfg.with(partition.WithOnRelease(func(_ partition.Claim, err error) { releasedErr.Store(releasedErr.Load() || err != nil) }))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	testenv.Until(t, "3 messages parked", func() (bool, error) {
		msgs, _ := parked.snapshot()
		return len(msgs) == 3, nil
	})
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v; want nil", err)
	}
	msgs, errs := parked.snapshot()
	for i, msg := range msgs {
		if msg.Offset != int64(i) || !errors.Is(errs[i], poison) {
			t.Fatalf("EventParked %d: offset %d, %v; want offset %d and the handler's error", i, msg.Offset, errs[i], i)
		}
	}
	rows, err := readParked(ctx, b.pool, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[2].offset != 2 || rows[0].attempts != 3 || !strings.HasSuffix(rows[0].errText, ": poison message") {
		t.Fatalf("parked rows %+v; want offsets 0-2, 3 attempts each, the handler's error", rows)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.next == nil || *r.next != 3 || releasedErr.Load() {
		t.Fatalf("stored offset %s, released with an error %v; want 3 and no error", offsetText(r.next), releasedErr.Load())
	}
}

func offsetText(o *int64) string {
	if o == nil {
		return "none"
	}
	return fmt.Sprint(*o)
}

// A handler that panics on every call: the panic is recovered as a
// *PanicError counted toward MaxAttempts, the message is parked with it
// (EventParked carries it, the parked row holds its text), and nothing else is
// written. The process and Run live on.
func TestHandlerPanicParks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 1)
	var calls atomic.Int32
	cfg := b.config("m", func(context.Context, pgx.Tx, []kafka.Message) error {
		calls.Add(1)
		panic("poison message")
	})
	cfg.with(partition.WithAttempts(2))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	testenv.Until(t, "the message parked", func() (bool, error) {
		msgs, _ := parked.snapshot()
		return len(msgs) == 1, nil
	})
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v; want nil", err)
	}
	_, errs := parked.snapshot()
	var pe *partition.PanicError
	if !errors.As(errs[0], &pe) || pe.Value != "poison message" || len(pe.Stack) == 0 {
		t.Fatalf("EventParked error %v; want the handler's panic", errs[0])
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d handler calls, want 2 (MaxAttempts)", n)
	}
	rows, err := readParked(ctx, b.pool, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !strings.Contains(rows[0].errText, "poison message") {
		t.Fatalf("parked rows %+v; want one with the panic", rows)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("results holds %d rows (%v), want 0", n, err)
	}
}

// A handler statement that always hits statement_timeout (57014) counts
// toward MaxAttempts, rather than being retried as transient for the whole
// generation: after two handler calls the message is parked with it.
func TestHandlerStatementTimeoutParks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 1)
	var calls atomic.Int32
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, _ []kafka.Message) error {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `SET LOCAL statement_timeout = '20ms'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(0.2)`)
		return err
	})
	cfg.with(partition.WithAttempts(2))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	testenv.Until(t, "the message parked", func() (bool, error) {
		msgs, _ := parked.snapshot()
		return len(msgs) == 1, nil
	})
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v; want nil", err)
	}
	_, errs := parked.snapshot()
	var pgErr *pgconn.PgError
	if !errors.As(errs[0], &pgErr) || pgErr.Code != "57014" {
		t.Fatalf("EventParked error %v; want the statement timeout", errs[0])
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d handler calls, want 2 (MaxAttempts)", n)
	}
	rows, err := readParked(ctx, b.pool, b.group, b.topic)
	if err != nil || len(rows) != 1 {
		t.Fatalf("parked rows %+v (%v); want one", rows, err)
	}
}

// A message whose handler ends its own connection every time is isolated
// and parked, like any other poison, instead of being retried as the
// database's trouble for as long as the generation lasts: the batch's
// other messages are applied, through PgBouncer (pgx's exec mode) as
// directly.
func TestHandlerConnectionLostEveryTimeParks(t *testing.T) {
	t.Parallel()
	for _, dep := range []string{"direct", "pgbouncer"} {
		t.Run(dep, func(t *testing.T) {
			t.Parallel()
			handlerConnectionLostEveryTimeParks(t, dep)
		})
	}
}

func handlerConnectionLostEveryTimeParks(t *testing.T, dep string) {
	ctx := context.Background()
	b := newBed(t, 1)
	if dep == "pgbouncer" {
		b.pool = testenv.PoolMode(t, testenv.PgBouncerDSNFor(t, b.schema), pgx.QueryExecModeExec, 8)
	}
	produce(t, b.brokers, b.topic, 1, 0, 3)
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs {
			if string(m.Value) == "0-1" {
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			}
		}
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(2))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	testenv.Until(t, "the message parked and the others applied", func() (bool, error) {
		msgs, _ := parked.snapshot()
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n)
		return len(msgs) == 1 && n == 2, err
	})
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v; want nil", err)
	}
	if msgs, _ := parked.snapshot(); msgs[0].Offset != 1 {
		t.Fatalf("parked offset %d, want 1 (value 0-1)", msgs[0].Offset)
	}
}
