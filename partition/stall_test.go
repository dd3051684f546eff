package partition_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// A PostgreSQL that stops answering for 12 BatchTimeouts is waited out:
// attempts that time out before the handler runs (connect, Begin, fence)
// are transient, so Run does not stop after MaxAttempts (3), and once the
// server answers again every offset is applied once, in order. The batch
// timeout (250 ms, 1 s under -race) leaves a batch room on a loaded
// machine once the server answers: three timeouts there would count, and
// park the batch's messages.
func TestStalledPostgresWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := testenv.PostgresSchema(t, 2)
	stall := testenv.NewGate() // shut: PostgreSQL stops answering, without closing connections
	dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), stall.Relay(), stall.Relay())
	pool := testenv.Pool(t, dsn, 8)
	b := newBedOn(t, 1, pool, schema)
	cfg := b.config("m", nil)
	batchTimeout := min(testenv.Scale(250*time.Millisecond), testRebalance/2) // below the rebalance timeout, as the option requires
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
	if err := testenv.Poll("20 rows, or a message parked", func() (bool, error) {
		var rows int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&rows)
		for _, st := range c.Stats() {
			if st.Parked > 0 {
				return false, fmt.Errorf("%d rows; parked after the stall: %+v", rows, st)
			}
		}
		return rows >= 20, err
	}); err != nil {
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
