package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// A handler that hangs in a statement holds its partition no longer than
// the batch timeout: its ctx ends, the transaction (and its write) rolls
// back, the attempt counts, and the retry applies the message; every
// message of the partition, the later ones included, is applied once.
func TestBatchTimeoutEndsAHungHandler(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook, inbox.WithBatchTimeout(testenv.Scale(time.Second)))
	var hangs atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if err := record(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "v-m2" && hangs.Add(1) == 1 {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(3600)`) // hangs until the batch timeout
			return err
		}
		return nil
	}
	var msgs []kafka.Message
	for i := range 6 {
		msgs = append(msgs, msg(fmt.Sprint("m", i), 0, int64(i)))
	}
	runSlice(t, in, msgs, h, func() bool { return len(effects(t, pool)) == len(msgs) })
	for id, n := range effects(t, pool) {
		if n != 1 {
			t.Errorf("effect %s applied %d times, want 1", id, n)
		}
	}
	if hangs.Load() < 2 || parked.Load() != 0 {
		t.Fatalf("m2 ran %d times, %d parked; want the hung attempt and a retry, nothing parked", hangs.Load(), parked.Load())
	}
}

// A handler stalled outside any statement, deaf to its ctx, is cut off by
// PostgreSQL (idle_in_transaction_session_timeout = the batch timeout):
// its session ends, so it holds no connection and no row lock, its write
// is rolled back, and when it finally returns its commit fails and the
// message is applied by a retry, once.
func TestBatchTimeoutEndsAStalledTransaction(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool, inbox.WithBatchTimeout(testenv.Scale(500*time.Millisecond)))
	pids := make(chan int32, 1)
	release := make(chan struct{})
	var stalls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if err := record(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "v-m1" && stalls.Add(1) == 1 {
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			<-release // deaf to ctx
		}
		return nil
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pid := <-pids
		defer close(release)
		// Probe until the server ended the stalled session.
		deadline := time.Now().Add(testenv.Scale(time.Minute))
		for count(t, pool, fmt.Sprintf(`SELECT count(*) FROM pg_stat_activity WHERE pid = %d`, pid)) != 0 {
			if time.Now().After(deadline) {
				t.Error("the stalled session was not ended by the server")
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	msgs := []kafka.Message{msg("m0", 0, 0), msg("m1", 0, 1), msg("m2", 0, 2)}
	runSlice(t, in, msgs, h, func() bool { return len(effects(t, pool)) == len(msgs) })
	<-done
	for id, n := range effects(t, pool) {
		if n != 1 {
			t.Errorf("effect %s applied %d times, want 1", id, n)
		}
	}
	if stalls.Load() < 2 {
		t.Fatalf("m1 ran %d times, want the stalled attempt and a retry", stalls.Load())
	}
}

// Process bounds its transaction by the batch timeout: a hung handler's
// failure is a *HandlerError wrapping the deadline, and nothing is
// recorded, so the batch can be tried again.
func TestProcessBatchTimeout(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool, inbox.WithBatchTimeout(testenv.Scale(200*time.Millisecond)))
	ctx := context.Background()
	m := msg("slow", 0, 0)
	_, err := in.Process(ctx, []kafka.Message{m}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		<-ctx.Done()
		return ctx.Err()
	})
	var he *inbox.HandlerError
	if !errors.As(err, &he) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Process with a hung handler: %v; want a *HandlerError wrapping the deadline", err)
	}
	if out, err := in.Process(ctx, []kafka.Message{m}, record); err != nil || out.Processed != 1 {
		t.Fatalf("Process again: %+v, %v; want it applied", out, err)
	}
}

// WithBatchTimeout below PostgreSQL's resolution is ErrInvalid.
func TestBatchTimeoutBadInput(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond} {
		if _, err := inbox.New(noIO{t}, "billing", inbox.WithBatchTimeout(d)); !errors.Is(err, inbox.ErrInvalid) {
			t.Errorf("WithBatchTimeout(%v): %v, want ErrInvalid", d, err)
		}
	}
}

// With a pgx.Tx as its DB, Process leaves the caller's transaction's
// idle_in_transaction_session_timeout alone (a SET LOCAL in a savepoint
// would outlive it); with a pool, the batch's transaction gets the batch
// timeout.
func TestBatchTimeoutLeavesTheCallersTx(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	newInbox(t, pool) // the tables
	ctx := context.Background()
	outer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(ctx)
	var before, inside, after string
	if err := outer.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	show := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		return tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&inside)
	}
	in, err := inbox.New(outer, "billing", inbox.WithBatchTimeout(7*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0)}, show); err != nil {
		t.Fatal(err)
	}
	if err := outer.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if inside != before || after != before {
		t.Fatalf("idle_in_transaction_session_timeout %q before, %q in the handler, %q after; want it left alone", before, inside, after)
	}
	byPool, err := inbox.New(pool, "billing", inbox.WithBatchTimeout(7*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := byPool.Process(ctx, []kafka.Message{msg("b", 0, 1)}, show); err != nil || inside != "7s" {
		t.Fatalf("in a pool's transaction: %q (%v), want 7s", inside, err)
	}
}
