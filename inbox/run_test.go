package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// produce writes one message per id (the id header and a payload) to
// partition 0 of topic, in order.
func produce(t testing.TB, brokers []string, topic string, ids []string, payload func(id string) string) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: len(ids),
		Balancer: kafka.BalancerFunc(func(kafka.Message, ...int) int { return 0 }), Transport: tr}
	defer w.Close()
	msgs := make([]kafka.Message, len(ids))
	for i, id := range ids {
		msgs[i] = kafka.Message{Value: []byte(payload(id))}
		if id != "" {
			msgs[i].Headers = []kafka.Header{{Key: "id", Value: []byte(id)}}
		}
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

func groupReader(brokers []string, topic, group string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: topic, GroupID: group, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
	})
}

// runUntil runs in.Run in the background until cond holds (or a minute,
// scaled, passes), then stops it and checks that it returned nil.
func runUntil(t *testing.T, in *inbox.Inbox, r inbox.Reader, h inbox.Handler, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx, r, h) }()
	deadline := time.Now().Add(testenv.Scale(time.Minute))
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("condition not reached within %v (Run: %v)", testenv.Scale(time.Minute), <-done)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func count(t testing.TB, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A poison message is retried up to the limit, a permanent one and one
// without identity are parked at once; the partition moves on, the hook
// sees each, and every other message is applied once.
func TestRunParksPoisonAndMovesOn(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	hooked, hook := parkCounter()
	in := newInbox(t, pool, inbox.WithAttempts(3), hook, inbox.WithMaxBatch(4), inbox.WithBatchWait(50*time.Millisecond))
	brokers, topic := testenv.Topic(t, 1)
	ids := []string{"m0", "m1", "poison", "m3", "permanent", "m5", "", "m7"}
	produce(t, brokers, topic, ids, func(id string) string { return "v-" + id })
	r := groupReader(brokers, topic, testenv.Name("g"))
	defer r.Close()
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		switch string(m.Value) {
		case "v-poison":
			return errors.New("downstream keeps failing")
		case "v-permanent":
			return inbox.Permanent(errors.New("malformed payload"))
		}
		return record(ctx, tx, m)
	}
	runUntil(t, in, r, h, func() bool { return count(t, pool, `SELECT count(*) FROM effects`) == 5 && hooked.Load() == 3 })
	got := effects(t, pool)
	for _, id := range []string{"m0", "m1", "m3", "m5", "m7"} {
		if got[id] != 1 {
			t.Errorf("effect %s applied %d times, want 1", id, got[id])
		}
	}
	rows, err := pool.Query(context.Background(), `SELECT coalesce(encode(value, 'escape'), ''), attempts FROM nolock_inbox_parked ORDER BY "offset"`)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var v string
		var n int
		err := row.Scan(&v, &n)
		return fmt.Sprintf("%s:%d", v, n), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint([]string{"v-poison:3", "v-permanent:1", "v-:1"}); fmt.Sprint(parked) != want {
		t.Fatalf("parked %v, want %v", parked, want)
	}
	if n := count(t, pool, `SELECT count(*) FROM nolock_inbox_attempts`); n != 0 {
		t.Fatalf("%d attempt counters left after parking, want 0", n)
	}
}

// countingReader passes fetches through and, when drop is set, forgets to
// commit offsets: the next reader of the group gets everything again.
// done counts the messages Run asked to commit (it does so once their
// batch is processed), dropped or not.
type countingReader struct {
	*kafka.Reader
	drop      bool
	fetched   atomic.Int64
	done      atomic.Int64
	committed atomic.Int64
}

func (c *countingReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := c.Reader.FetchMessage(ctx)
	if err == nil {
		c.fetched.Add(1)
	}
	return m, err
}

func (c *countingReader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	c.done.Add(int64(len(msgs)))
	if c.drop {
		return nil
	}
	err := c.Reader.CommitMessages(ctx, msgs...)
	if err == nil {
		c.committed.Add(int64(len(msgs)))
	}
	return err
}

// Every message comes twice (no offset was committed the first time):
// the second pass applies nothing, by header and by watermark.
func TestRunRedeliveryIsSkipped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		id   inbox.Identity
	}{{"header", inbox.ByHeader("id")}, {"watermark", inbox.ByWatermark()}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testenv.Postgres(t)
			in := newInbox(t, pool, inbox.WithIdentity(tc.id), inbox.WithMaxBatch(8), inbox.WithBatchWait(20*time.Millisecond))
			brokers, topic := testenv.Topic(t, 1)
			var ids []string
			for i := 0; i < 60; i++ {
				ids = append(ids, fmt.Sprint("p", i))
			}
			produce(t, brokers, topic, ids, func(id string) string { return "v-" + id })
			group := testenv.Name("g")
			var calls atomic.Int64
			h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error { calls.Add(1); return record(ctx, tx, m) }
			for pass := 0; pass < 2; pass++ {
				r := &countingReader{Reader: groupReader(brokers, topic, group), drop: true}
				runUntil(t, in, r, h, func() bool { return r.done.Load() == int64(len(ids)) })
				r.Close()
			}
			got := effects(t, pool)
			if calls.Load() != int64(len(ids)) || len(got) != len(ids) {
				t.Fatalf("handler ran %d times, %d distinct effects, for %d messages delivered twice", calls.Load(), len(got), len(ids))
			}
			for id, n := range got {
				if n != 1 {
					t.Fatalf("effect %s applied %d times", id, n)
				}
			}
		})
	}
}

// A handler whose connection dies under it (here its backend is
// terminated, while the server stays up) did not fail on its message:
// with one attempt allowed, nothing is parked, every message is applied
// once.
func TestRunConnectionLossIsNotTheMessagesFault(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, inbox.WithAttempts(1), hook, inbox.WithMaxBatch(4), inbox.WithBatchWait(20*time.Millisecond))
	brokers, topic := testenv.Topic(t, 1)
	ids := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	produce(t, brokers, topic, ids, func(id string) string { return "v-" + id })
	r := groupReader(brokers, topic, testenv.Name("g"))
	defer r.Close()
	var kills atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "v-m2" && kills.Add(1) <= 3 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return record(ctx, tx, m)
	}
	runUntil(t, in, r, h, func() bool { return parked.Load() > 0 || count(t, pool, `SELECT count(*) FROM effects`) == len(ids) })
	got := effects(t, pool)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("effect %s applied %d times, want 1", id, got[id])
		}
	}
	if k := count(t, pool, `SELECT (SELECT count(*) FROM nolock_inbox_parked) + (SELECT count(*) FROM nolock_inbox_attempts)`); k != 0 || kills.Load() < 3 {
		t.Fatalf("%d parked or counted failures after %d backend kills, want 0 after at least 3", k, kills.Load())
	}
}
