package partition_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// stallRelay copies src to dst chunk by chunk, holding each chunk while
// stalled is set: a PostgreSQL that stops answering without closing its
// connections.
func stallRelay(stalled *atomic.Bool) testenv.Relay {
	return func(dst io.Writer, src io.Reader) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			for n > 0 && stalled.Load() {
				time.Sleep(5 * time.Millisecond)
			}
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
}

// A PostgreSQL that stops answering for 12 BatchTimeouts is waited out:
// attempts that time out before the handler runs (connect, Begin, fence)
// are transient, so Run does not stop after MaxAttempts, and once the
// server answers again every offset is applied once, in order. Before,
// each timed-out attempt counted toward MaxAttempts and Run returned after
// three.
func TestStalledPostgresWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := testenv.PostgresSchema(t, 2)
	var stalled atomic.Bool
	dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), stallRelay(&stalled), stallRelay(&stalled))
	pool := testenv.Pool(t, dsn, 8)
	b := newBedOn(t, 1, pool, schema)
	cfg := b.config("m", nil)
	cfg.BatchTimeout = 500 * time.Millisecond
	cfg.MaxAttempts = 3
	c, err := partition.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	produce(t, b.brokers, b.topic, 1, 0, 10)
	if err := waitRows(ctx, pool, 10, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	stalled.Store(true)
	produce(t, b.brokers, b.topic, 1, 10, 10)
	select {
	case err := <-done:
		stalled.Store(false)
		t.Fatalf("Run returned during the stall: %v", err)
	case <-time.After(6 * time.Second):
	}
	stalled.Store(false)
	if err := waitRows(ctx, pool, 20, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	tl, err := count(ctx, pool, 1, 20)
	if err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || tl.rows != 20 {
		t.Fatalf("results: %v; want 20 rows, exact", tl)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v, want nil after cancel", err)
	}
}
