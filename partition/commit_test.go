package partition_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// A batch whose COMMIT takes longer than BatchTimeout (a deferred trigger
// sleeps in it) is not cancelled: the worker stops waiting, treats the
// outcome as unknown, and its next attempt's fence waits for the commit
// and finds it committed. The handler ran once, the commit's own marker
// row exists (it was not cut off), every offset is applied once and
// nothing is parked, although MaxAttempts is 1.
func TestSlowCommitNotCancelledNotRepeated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	secs := testBatchTimeout.Seconds() + 1
	if _, err := b.pool.Exec(ctx, `
		CREATE TABLE slow (id int);
		CREATE TABLE slow_done (id int);
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(`+formatSecs(secs)+`); INSERT INTO slow_done VALUES (NEW.id); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON slow DEFERRABLE INITIALLY DEFERRED
		FOR EACH ROW EXECUTE FUNCTION slow_commit();`); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, 1, 0, 5)
	var calls atomic.Int32
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if calls.Add(1) == 1 {
			if _, err := tx.Exec(ctx, `INSERT INTO slow VALUES (1)`); err != nil {
				return err
			}
		}
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(1))
	cfg.with(partition.WithMaxBatch(1))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, 5); err != nil {
		t.Fatal(err)
	}
	testenv.Until(t, "stored offset 5", func() (bool, error) {
		r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
		return err == nil && r.next != nil && *r.next == 5, err
	})
	var dups int64
	for _, s := range m.c.Stats() {
		dups += s.Duplicates
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if dups != 1 {
		t.Errorf("Stats counted %d duplicates, want 1: the batch whose slow commit landed", dups)
	}
	tl, err := count(ctx, b.pool, 1, 5)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := parked.snapshot()
	var done int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM slow_done`).Scan(&done); err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || tl.rows != 5 || len(msgs) != 0 || done != 1 || calls.Load() != 5 {
		t.Fatalf("results %v, %d parked, slow commit done %d times, %d handler calls; want exact 5 rows, 0 parked, 1, 5 calls", tl, len(msgs), done, calls.Load())
	}
}

func formatSecs(s float64) string { return strconv.FormatFloat(s, 'f', 3, 64) }
