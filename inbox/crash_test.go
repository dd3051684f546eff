package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/segmentio/kafka-go"
)

// Fault: the PostgreSQL server crashes (every server process killed at
// once; a cluster of the test's own) in the middle of a batch a third of
// the way through 600 messages, consumed in batches of 8, and comes back
// 300 ms later. Run
// rides it out: every message's effect is applied exactly once, none is
// parked, and Run returns nil when stopped.
func TestRunSurvivesServerCrash(t *testing.T) {
	t.Parallel()
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 8)
	var retries lineCounter // Run's warnings about failed batches it retries
	in := newInbox(t, pool, inbox.WithLogger(slog.New(slog.NewTextHandler(&retries, nil))),
		inbox.WithMaxBatch(8), inbox.WithBatchWait(20*time.Millisecond), inbox.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	brokers, topic := testenv.Topic(t, 1)
	const n = 600
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("m", i)
	}
	produce(t, brokers, topic, ids, func(id string) string { return "v-" + id })
	r := groupReader(brokers, topic, testenv.Name("g"))
	defer r.Close()

	// The handler of the n/3-th message waits while the test crashes the
	// server, then runs on the dead connection: the crash always lands in
	// a batch, however the machine schedules this test.
	crashNow, crashed := make(chan struct{}), make(chan struct{})
	var seen atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if seen.Add(1) == n/3 {
			close(crashNow)
			<-crashed
		}
		return record(ctx, tx, m)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- in.Run(ctx, r, h)
	}()
	applied := func() int { // -1 while the server is down
		var k int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&k); err != nil {
			return -1
		}
		return k
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(testenv.Scale(time.Minute)); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (%d effects applied)", what, testenv.Scale(time.Minute), applied())
			}
		}
	}
	select {
	case <-crashNow:
	case <-time.After(testenv.Scale(time.Minute)):
		t.Fatalf("message %d not reached within %v (%d effects applied)", n/3, testenv.Scale(time.Minute), applied())
	}
	srv.Crash()
	close(crashed)
	time.Sleep(300 * time.Millisecond) // the fault: the server stays down
	srv.Start()
	waitUntil("all applied after the restart", func() bool { return applied() == n })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := effects(t, pool)
	for _, id := range ids {
		if got[id] != 1 {
			t.Errorf("effect %s applied %d times, want 1", id, got[id])
		}
	}
	if retries.n.Load() == 0 {
		t.Error("Run retried no batch: the crash hit nothing")
	}
	t.Logf("Run logged %d warnings across the crash", retries.n.Load())
	if len(got) != n {
		t.Errorf("%d distinct effects, want %d", len(got), n)
	}
	if k := count(t, pool, `SELECT (SELECT count(*) FROM nolock_inbox_parked) + (SELECT count(*) FROM nolock_inbox_attempts)`); k != 0 {
		t.Errorf("%d messages parked or with failed attempts counted, want 0: a database outage is not the message's fault", k)
	}
}

// lineCounter counts the log lines written to it.
type lineCounter struct{ n atomic.Int64 }

func (c *lineCounter) Write(p []byte) (int, error) {
	c.n.Add(int64(bytes.Count(p, []byte("\n"))))
	return len(p), nil
}
