package partition_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
	"github.com/segmentio/kafka-go"
)

// Fault: the PostgreSQL server crashes (every server process killed at
// once; a cluster of the test's own) in the middle of a batch while two
// members consume a two-partition topic, and comes back 300 ms later. The members ride it
// out (failed batches retried, claims kept or taken again): every offset
// is applied exactly once, in order, and both Runs end cleanly.
func TestServerCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const per = 300
	srv := testenv.PostgresServer(t)
	b := newBedOn(t, 2, testenv.Pool(t, srv.DSN(), 16), "public")
	produce(t, b.brokers, b.topic, 2, 0, per)
	var retries atomic.Int64 // batches and claims retried, as the members log them
	// The handler that reaches two thirds of the messages waits while the
	// test crashes the server, then runs on the dead connection: the crash
	// always lands in a batch, however the machine schedules this test.
	crashNow, crashed := make(chan struct{}), make(chan struct{})
	var seen atomic.Int64
	cfg := func(name string) spec {
		rec := record(name)
		cfg := b.config(name, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			if n := seen.Add(int64(len(msgs))); n >= 2*per*2/3 && n-int64(len(msgs)) < 2*per*2/3 {
				close(crashNow)
				<-crashed
			}
			return rec(ctx, tx, msgs)
		})
		cfg.with(partition.WithLogger(slog.New(countRetries{slog.DiscardHandler, &retries})))
		return cfg
	}
	a := startMember(t, b.pool, cfg("a"))
	c := startMember(t, b.pool, cfg("c"))
	select {
	case <-crashNow:
	case <-time.After(testenv.Scale(time.Minute)):
		t.Fatalf("two thirds of the messages not handled within %v", testenv.Scale(time.Minute))
	}
	srv.Crash()
	close(crashed)
	time.Sleep(300 * time.Millisecond) // the fault: the server stays down
	srv.Start()
	testenv.Until(t, "every offset applied after the restart", func() (bool, error) {
		tl, err := count(ctx, b.pool, 2, per)
		return err == nil && tl.missing == 0, nil // errors while the server recovers
	})
	for name, m := range map[string]*member{"a": a, "c": c} {
		if err := m.stop(); err != nil {
			t.Errorf("member %s: Run: %v", name, err)
		}
	}
	if retries.Load() == 0 {
		t.Error("no batch or claim was retried: the crash hit nothing")
	}
	tl, err := count(ctx, b.pool, 2, per)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d retries logged across the crash", retries.Load())
	if !tl.exact() || tl.rows != 2*per {
		t.Fatalf("results %v, want each of the %d offsets once, in order", tl, 2*per)
	}
}

// countRetries counts the records whose message says something is
// retried.
type countRetries struct {
	slog.Handler
	n *atomic.Int64
}

func (c countRetries) Enabled(context.Context, slog.Level) bool { return true }

func (c countRetries) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "retrying") {
		c.n.Add(1)
	}
	return nil
}

func (c countRetries) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c countRetries) WithGroup(string) slog.Handler      { return c }
