package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// A PostgreSQL that stops answering for 12 BatchTimeouts is waited out:
// attempts that time out before the handler runs (connect, Begin, fence)
// are transient, so Run does not stop after MaxAttempts (3), and once the
// server answers again every offset is applied once, in order.
func TestStalledPostgresWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := testenv.PostgresSchema(t, 2)
	stall := testenv.NewGate() // shut: PostgreSQL stops answering, without closing connections
	dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), stall.Relay(), stall.Relay())
	pool := testenv.Pool(t, dsn, 8)
	b := newBedOn(t, 1, pool, schema)
	cfg := b.config("m", nil)
	batchTimeout := testenv.Scale(125 * time.Millisecond)
	cfg.with(partition.WithBatchTimeout(batchTimeout))
	cfg.with(partition.WithAttempts(3))
	c, err := newConsumer(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, cfg.handler) }()

	produce(t, b.brokers, b.topic, 1, 0, 10)
	if err := waitRows(ctx, pool, 10); err != nil {
		t.Fatal(err)
	}
	stall.Shut()
	produce(t, b.brokers, b.topic, 1, 10, 10)
	select {
	case err := <-done:
		stall.Open()
		t.Fatalf("Run returned during the stall: %v", err)
	case <-time.After(12 * batchTimeout): // the fault: 12 batch timeouts of silence
	}
	stall.Open()
	if err := waitRows(ctx, pool, 20); err != nil {
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
