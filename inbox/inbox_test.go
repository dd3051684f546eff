package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

func msg(id string, partition int, offset int64) kafka.Message {
	m := kafka.Message{Topic: "payments", Partition: partition, Offset: offset, Value: []byte("v-" + id)}
	if id != "" {
		m.Headers = []kafka.Header{{Key: "id", Value: []byte(id)}}
	}
	return m
}

// record is the handler used throughout: one effect row per run.
func record(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, string(m.Headers[0].Value), string(m.Value))
	return err
}

func effects(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, count(*) FROM effects GROUP BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		got[id] = n
	}
	return got
}

func TestProcessSkipsDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool)
	out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1), msg("a", 0, 2)}, record)
	if err != nil || out != (inbox.Outcome{Processed: 2, Duplicates: 1}) {
		t.Fatalf("first batch: %+v, %v; want 2 processed and the producer's duplicate skipped", out, err)
	}
	// Kafka redelivers the batch (a crash before the offset commit).
	out, err = in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1), msg("c", 0, 3)}, record)
	if err != nil || out != (inbox.Outcome{Processed: 1, Duplicates: 2}) {
		t.Fatalf("redelivery: %+v, %v; want only c processed", out, err)
	}
	if got := effects(t, pool); len(got) != 3 || got["a"] != 1 || got["b"] != 1 || got["c"] != 1 {
		t.Fatalf("effects %v; want a, b and c once each", got)
	}
}

// A handler's failure rolls back the whole batch: no effect, no record, so
// the batch runs again in full, unlike a deduplicator that marks messages
// seen before the effect commits.
func TestProcessHandlerErrorRecordsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool)
	boom := errors.New("downstream refused")
	_, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1)}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if err := record(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Headers[0].Value) == "b" {
			return boom
		}
		return nil
	})
	var he *inbox.HandlerError
	if !errors.Is(err, boom) || !errors.As(err, &he) || he.Index != 1 {
		t.Fatalf("err = %v; want the handler's error on message 1", err)
	}
	if got := effects(t, pool); len(got) != 0 {
		t.Fatalf("effects %v after a failed batch; want none", got)
	}
	out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1)}, record)
	if err != nil || out.Processed != 2 {
		t.Fatalf("retry: %+v, %v; want both processed", out, err)
	}
}

func TestIdentities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("no header", func(t *testing.T) {
		t.Parallel()
		in := newInbox(t, testenv.Postgres(t))
		if _, err := in.Process(ctx, []kafka.Message{msg("", 0, 0)}, record); !errors.Is(err, inbox.ErrNoID) {
			t.Fatalf("message without the id header: %v, want ErrNoID", err)
		}
	})
	t.Run("offset misses a producer duplicate", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		in := newInbox(t, pool, inbox.WithIdentity(inbox.ByOffset()))
		// The same payment sent twice lands at two offsets: ByOffset runs it twice.
		if _, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("a", 0, 1)}, record); err != nil {
			t.Fatal(err)
		}
		out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 1)}, record) // redelivery: caught
		if err != nil || out.Duplicates != 1 || effects(t, pool)["a"] != 2 {
			t.Fatalf("%+v, %v, effects %v; want the redelivery skipped and the producer duplicate applied", out, err, effects(t, pool))
		}
	})
	t.Run("watermark", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		in := newInbox(t, pool, inbox.WithIdentity(inbox.ByWatermark()))
		batch := []kafka.Message{msg("a", 0, 0), msg("b", 0, 1), msg("x", 1, 0)}
		if out, err := in.Process(ctx, batch, record); err != nil || out.Processed != 3 {
			t.Fatalf("%+v, %v", out, err)
		}
		out, err := in.Process(ctx, []kafka.Message{msg("b", 0, 1), msg("c", 0, 2), msg("x", 1, 0), msg("y", 1, 1)}, record)
		if err != nil || out != (inbox.Outcome{Processed: 2, Duplicates: 2}) {
			t.Fatalf("redelivery: %+v, %v; want c and y processed, b and x skipped", out, err)
		}
		var rows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM nolock_inbox`).Scan(&rows); err != nil || rows != 0 {
			t.Fatalf("watermark mode wrote %d inbox rows (%v), want 0", rows, err)
		}
	})
	t.Run("func", func(t *testing.T) {
		t.Parallel()
		pool := testenv.Postgres(t)
		in := newInbox(t, pool, inbox.WithIdentity(inbox.ByFunc(func(m kafka.Message) (string, error) { return string(m.Value), nil })))
		out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("a", 0, 9)}, record)
		if err != nil || out.Duplicates != 1 {
			t.Fatalf("%+v, %v; want the same payload seen once", out, err)
		}
	})
}

// Two consumers process the same message at once (a rebalance hands the
// partition over while the old owner still works): the second waits on the
// first's claim and skips; exactly one effect.
func TestConcurrentDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool)
	for round := 0; round < 20; round++ {
		id := fmt.Sprint("m", round)
		var wg sync.WaitGroup
		results := make([]inbox.Outcome, 4)
		for w := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := in.Process(ctx, []kafka.Message{msg(id, 0, int64(round))}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
					time.Sleep(2 * time.Millisecond) // hold the claim a moment
					return record(ctx, tx, m)
				})
				if err != nil {
					t.Error(err)
				}
				results[w] = out
			}()
		}
		wg.Wait()
		processed := 0
		for _, r := range results {
			processed += r.Processed
		}
		if processed != 1 || effects(t, pool)[id] != 1 {
			t.Fatalf("round %d: %d processed, %d effects; want exactly 1", round, processed, effects(t, pool)[id])
		}
	}
}

func TestReap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool)
	var batch []kafka.Message
	for i := 0; i < 25; i++ {
		batch = append(batch, msg(fmt.Sprint("old", i), 0, int64(i)))
	}
	if _, err := in.Process(ctx, batch, record); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE nolock_inbox SET processed_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Process(ctx, []kafka.Message{msg("new", 0, 99)}, record); err != nil {
		t.Fatal(err)
	}
	n, err := in.Reap(ctx, 24*time.Hour, 10)
	if err != nil || n != 25 {
		t.Fatalf("reaped %d (%v), want 25 in batches of 10", n, err)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM nolock_inbox`).Scan(&left); err != nil || left != 1 {
		t.Fatalf("%d rows left (%v), want the recent one", left, err)
	}
	if _, err := in.Reap(ctx, 0, 10); !errors.Is(err, inbox.ErrInvalid) {
		t.Fatalf("Reap with no retention: %v, want ErrInvalid", err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"nil db", func() error { _, err := inbox.New(nil, "c"); return err }()},
		{"empty consumer", func() error { _, err := inbox.New(pool, ""); return err }()},
		{"empty identity", func() error { _, err := inbox.New(pool, "c", inbox.WithIdentity(inbox.Identity{})); return err }()},
		{"zero attempts", func() error { _, err := inbox.New(pool, "c", inbox.WithAttempts(0)); return err }()},
		{"header without a name", func() error { _, err := inbox.New(pool, "c", inbox.WithIdentity(inbox.ByHeader(""))); return err }()},
		{"nil option", func() error { _, err := inbox.New(pool, "c", nil); return err }()},
		{"nil handler", func() error {
			in := newInbox(t, pool)
			_, err := in.Process(context.Background(), []kafka.Message{msg("a", 0, 0)}, nil)
			return err
		}()},
	} {
		if !errors.Is(tc.err, inbox.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", tc.name, tc.err)
		}
	}
}
