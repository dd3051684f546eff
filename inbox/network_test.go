package inbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// A transaction delayed in the network never applies a message twice.
// Member A reaches PostgreSQL through a proxy that holds its packets while
// its gate is shut and delivers them, late, when it opens; member B, on a
// direct connection, processes the same batch meanwhile. In turn:
//
//   - "late": A's transaction is held before it reaches the server; B
//     applies the batch; A's transaction arrives, finds every message
//     recorded, and applies none.
//   - "commit held": A's COMMIT is held, its transaction open with the
//     batch claimed and applied; B's claim waits on A's; A's COMMIT
//     arrives and commits, and B finds every message recorded.
//   - "session ended": A's COMMIT is held and PostgreSQL ends A's session
//     meanwhile (pg_terminate_backend): A's transaction rolls back, B
//     applies the batch, and A's late COMMIT reports an error, never
//     success.
//
// Every message's effect is applied exactly once.
func TestDelayedTransactionAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 4)
	gate := testenv.NewGate()
	a := newInbox(t, testenv.Pool(t, testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), gate.Relay(), gate.Relay()), 1))
	defer gate.Open() // before the proxy closes, also on failure
	b, err := inbox.New(pool, "billing")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		out inbox.Outcome
		err error
	}
	process := func(in *inbox.Inbox, batch []kafka.Message, h inbox.Handler) <-chan result {
		done := make(chan result, 1)
		go func() { out, err := in.Process(ctx, batch, h); done <- result{out, err} }()
		return done
	}
	held := func() (bool, error) { return gate.Held() > 0, nil }

	kinds := []string{"late", "commit held", "session ended"}
	trials := len(kinds) * testenv.Trials(3, 200)
	const size = 5
	var ids []string
	for i := range trials {
		kind := kinds[i%len(kinds)]
		batch := make([]kafka.Message, size)
		for j := range batch {
			id := fmt.Sprintf("d%d-%d", i, j)
			batch[j] = msg(id, 0, int64(i*size+j))
			ids = append(ids, id)
		}
		// hold shuts the gate once A's handler applied the whole batch:
		// what A sends next, its COMMIT, is held. pid is A's backend.
		var pid int32
		handled := 0
		hold := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			if err := record(ctx, tx, m); err != nil {
				return err
			}
			if handled++; handled == size {
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				gate.Shut()
			}
			return nil
		}
		var ra, rb result
		switch kind {
		case "late":
			gate.Shut()
			aDone := process(a, batch, record)
			testenv.Until(t, "A's transaction sits in the network", held)
			rb = <-process(b, batch, record)
			gate.Open()
			ra = <-aDone
			if ra.err != nil || ra.out.Processed != 0 {
				t.Errorf("trial %d (%s): A's late transaction: %+v, %v; want nothing applied", i, kind, ra.out, ra.err)
			}
		case "commit held":
			aDone := process(a, batch, hold)
			testenv.Until(t, "A's COMMIT sits in the network", held)
			bDone := process(b, batch, record)
			testenv.WaitLockWaiters(t, pool, 1) // B's claim waits on A's
			gate.Open()
			ra, rb = <-aDone, <-bDone
			if ra.err != nil || ra.out.Processed != size {
				t.Errorf("trial %d (%s): A: %+v, %v; want its batch committed", i, kind, ra.out, ra.err)
			}
		case "session ended":
			aDone := process(a, batch, hold)
			testenv.Until(t, "A's COMMIT sits in the network", held)
			if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			testenv.Until(t, "A's session ends", func() (bool, error) {
				var alive bool
				err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive)
				return !alive, err
			})
			rb = <-process(b, batch, record)
			gate.Open()
			ra = <-aDone
			if ra.err == nil {
				t.Errorf("trial %d (%s): A's COMMIT on an ended session reported success: %+v", i, kind, ra.out)
			}
		}
		if rb.err != nil || ra.out.Processed+rb.out.Processed != size {
			t.Errorf("trial %d (%s): A applied %d, B applied %d (%v); want %d in all", i, kind, ra.out.Processed, rb.out.Processed, rb.err, size)
		}
	}
	got := effects(t, pool)
	lost, doubled := 0, 0
	for _, id := range ids {
		switch n := got[id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled += n - 1
		}
	}
	testenv.Figures(t, "inbox delayed transaction", "%d trials, %d messages, %d lost, %d doubled", trials, len(ids), lost, doubled)
	if lost != 0 || doubled != 0 {
		t.Errorf("%d messages: %d lost, %d applied more than once", len(ids), lost, doubled)
	}
}
