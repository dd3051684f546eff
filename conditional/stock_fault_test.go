package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// killLockWaiters waits until some session of this test's schema waits
// for a lock, then terminates every such session.
func killLockWaiters(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	testenv.WaitLockWaiters(t, pool, 1)
	if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND application_name = current_setting('application_name')`); err != nil {
		t.Fatal(err)
	}
}

// A coalesced batch whose backend is killed while it waits on the row lock:
// every take of the batch gets the same answer, ErrAmbiguousCommit (the
// statement was sent, and a terminated session does not say whether it
// committed), and nothing is taken.
func TestStockKilledBatchFailsEveryTake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s, release := lockedStock(t, pool)
	first := make(chan error, 1)
	go func() { first <- s.Take(ctx, "sku", 1) }() // a batch of one, blocked
	testenv.WaitLockWaiters(t, pool, 1)
	const queuedTakes = 4
	batch := make(chan error, queuedTakes)
	for i := 0; i < queuedTakes; i++ {
		go func() { batch <- s.Take(ctx, "sku", 1) }() // queue behind it
	}
	testenv.WaitParked(t, queuedTakes, queued)
	killLockWaiters(t, pool) // the first statement dies; the four queued go out as one batch and block
	if err := <-first; err == nil {
		t.Fatal("the killed take reported success")
	}
	killLockWaiters(t, pool)
	var msgs []string
	for i := 0; i < queuedTakes; i++ {
		err := <-batch
		if !errors.Is(err, conditional.ErrAmbiguousCommit) {
			t.Fatalf("take %d of the killed batch: %v, want ErrAmbiguousCommit", i, err)
		}
		msgs = append(msgs, err.Error())
	}
	for _, m := range msgs[1:] {
		if m != msgs[0] {
			t.Fatalf("the batch's takes got different errors: %q", msgs)
		}
	}
	release()
	if got := available(t, s, "sku"); got != 10 {
		t.Fatalf("available %d after two killed statements, want 10", got)
	}
}

// stockWorker is a fault-trial worker's own way to the database: a pool
// whose sessions carry an application_name of their own (so the test can
// find them), through a proxy that can cut its connections, and two
// Stocks on it, one coalescing, one not.
type stockWorker struct {
	app    string
	pool   *pgxpool.Pool
	cut    *testenv.Cutter
	stocks [2]*conditional.Stock
}

func newStockWorkers(t *testing.T, schema string, n int) []*stockWorker {
	t.Helper()
	ws := make([]*stockWorker, n)
	for i := range ws {
		w := &stockWorker{app: fmt.Sprintf("%s-w%d", schema, i), cut: testenv.NewCutter()}
		u, err := url.Parse(testenv.PostgresDSNFor(t, schema))
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("application_name", w.app)
		u.RawQuery = q.Encode()
		dsn := testenv.Proxy(t, u.String(), w.cut.Wrap(nil), w.cut.Wrap(nil))
		w.pool = testenv.Pool(t, dsn, 4)
		for j, coalesce := range []bool{true, false} {
			s, err := conditional.NewStock(w.pool, conditional.WithCoalescing(coalesce))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			w.stocks[j] = s
		}
		ws[i] = w
	}
	return ws
}

// stockTrial is what a Stock fault trial told its caller, and what the
// database says it did.
type stockTrial struct {
	key     string
	n       int64
	told    error
	blocked bool // the fault came while the take waited on the row lock
}

// stockOutcomes counts the outcomes of the trials, by what the caller was
// told and what was applied.
type stockOutcomes struct {
	blockedUnknownApplied, blockedUnknownNot atomic.Int64
	ok, unknownApplied, unknownNot, refused  atomic.Int64
}

// stockFaultTrials runs Stock fault trials: each stocks a key of its own
// with 10 units and takes 1 to 3 of them, through a worker's coalescing
// Stock or its other one, while fault strikes the take's session: half
// of the trials while the take waits on the key's row, locked by another
// transaction (the take has been sent: the caller must be told
// ErrAmbiguousCommit), half at a random instant (anything may happen).
// Once the fault has played out on the server, what the caller was told
// must be true: success means the units were taken, ErrAmbiguousCommit
// either, any other error that nothing was taken. fault gets a pool of
// the test's own, the worker, while blocked the sessions that wait behind
// the lock (the take's), and a channel closed when the take returns.
func stockFaultTrials(t *testing.T, fault func(admin *pgxpool.Pool, w *stockWorker, blocked []int32, returned <-chan struct{}) error) *stockOutcomes {
	t.Helper()
	ctx := context.Background()
	admin, schema := testenv.PostgresSchema(t, 3*8)
	setup := newStock(t, admin)
	workers := newStockWorkers(t, schema, 8)
	var out stockOutcomes
	trials := make([]stockTrial, testenv.Trials(8, 1000))
	testenv.RunTrials(t, len(trials), len(workers), func(wi, i int) {
		w := workers[wi]
		tr := &trials[i]
		tr.key, tr.n, tr.blocked = fmt.Sprint("sku-", i), int64(1+i%3), i%2 == 0
		s := w.stocks[i/2%2]
		if err := setup.Put(ctx, tr.key, 10); err != nil {
			t.Error(err)
			return
		}
		var release func()
		var lockerPID int32
		if tr.blocked {
			tx, err := admin.Begin(ctx)
			if err == nil {
				release = func() { tx.Rollback(ctx) }
				err = tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM nolock_stock WHERE key = $1 FOR UPDATE`, tr.key).Scan(&lockerPID)
			}
			if err != nil {
				t.Error(err)
				return
			}
			defer release()
		}
		done, returned := make(chan error, 1), make(chan struct{})
		go func() { done <- s.Take(ctx, tr.key, tr.n); close(returned) }()
		if tr.blocked {
			var pids []int32
			err := testenv.Poll("the take of "+tr.key+" waits on the row lock", func() (bool, error) {
				rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, lockerPID)
				if err != nil {
					return false, err
				}
				defer rows.Close()
				pids = pids[:0]
				for rows.Next() {
					var pid int32
					if err := rows.Scan(&pid); err != nil {
						return false, err
					}
					pids = append(pids, pid)
				}
				return len(pids) > 0, rows.Err()
			})
			if err != nil {
				t.Error(err)
				return
			}
			if err := fault(admin, w, pids, returned); err != nil {
				t.Error(err)
				return
			}
		} else {
			time.Sleep(time.Duration(rand.Int64N(int64(time.Millisecond)))) // the fault strikes from a random instant on
			if err := fault(admin, w, nil, returned); err != nil {
				t.Error(err)
				return
			}
		}
		tr.told = <-done
		if tr.blocked {
			release()
		}
		// The fault has played out once no session of the worker is in
		// a statement or a transaction: a session whose client is gone
		// finishes what it was running, then notices.
		err := testenv.Poll("the sessions of "+w.app+" settle", func() (bool, error) {
			var busy int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'`, w.app).Scan(&busy)
			return busy == 0, err
		})
		if err != nil {
			t.Error(err)
			return
		}
		w.pool.Reset() // no connection the fault broke serves the next trial
		if err := checkStockTrial(ctx, setup, tr, &out); err != nil {
			t.Errorf("%s: %v", tr.key, err)
		}
	})
	if t.Failed() {
		return nil
	}
	// Again, all at once: nothing changed after its trial was judged.
	var again stockOutcomes
	for i := range trials {
		if err := checkStockTrial(ctx, setup, &trials[i], &again); err != nil {
			t.Errorf("%s, checked again after the trials: %v", trials[i].key, err)
		}
	}
	return &out
}

// checkStockTrial checks that what the trial's caller was told is true of
// the stock, and counts the outcome.
func checkStockTrial(ctx context.Context, s *conditional.Stock, tr *stockTrial, out *stockOutcomes) error {
	left, err := s.Available(ctx, tr.key)
	if err != nil {
		return err
	}
	applied := left == 10-tr.n
	if !applied && left != 10 {
		return fmt.Errorf("%d units left of 10 after a take of %d (told %v): units lost or taken twice", left, tr.n, tr.told)
	}
	unknown := errors.Is(tr.told, conditional.ErrAmbiguousCommit)
	switch {
	case tr.blocked && !unknown:
		return fmt.Errorf("a take sent and waiting on the row lock when the fault struck was told %v, want ErrAmbiguousCommit", tr.told)
	case tr.blocked && applied:
		out.blockedUnknownApplied.Add(1)
	case tr.blocked:
		out.blockedUnknownNot.Add(1)
	case tr.told == nil && !applied:
		return fmt.Errorf("told success, and %d units are left of 10: nothing was taken", left)
	case tr.told == nil:
		out.ok.Add(1)
	case unknown && applied:
		out.unknownApplied.Add(1)
	case unknown:
		out.unknownNot.Add(1)
	case applied:
		return fmt.Errorf("told %v (nothing taken), and %d units were taken", tr.told, tr.n)
	default:
		out.refused.Add(1)
	}
	return nil
}

// figures logs the outcome counts of a Stock fault test.
func (o *stockOutcomes) figures(t *testing.T, trial, fault string) {
	t.Helper()
	blocked := o.blockedUnknownApplied.Load() + o.blockedUnknownNot.Load()
	random := o.ok.Load() + o.unknownApplied.Load() + o.unknownNot.Load() + o.refused.Load()
	testenv.Figures(t, trial, "%d trials; %s while the take waited on the row lock %d: told ErrAmbiguousCommit %d (applied after the fault %d, not applied %d); at a random instant %d: told success %d (all applied), ErrAmbiguousCommit %d (applied %d, not %d), an error that proves nothing was taken %d (none applied); 0 units lost, 0 taken twice",
		blocked+random, fault, blocked, blocked, o.blockedUnknownApplied.Load(), o.blockedUnknownNot.Load(),
		random, o.ok.Load(), o.unknownApplied.Load()+o.unknownNot.Load(), o.unknownApplied.Load(), o.unknownNot.Load(), o.refused.Load())
}

// Fault: the take's backend is terminated (pg_terminate_backend), while
// the take waits on the row lock, or at a random instant: from then on,
// whenever the take's session runs a statement, until the take returns.
// See stockFaultTrials: no unit is lost or taken twice, and every caller
// is told the truth.
func TestStockBackendKillTellsTheTruth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	out := stockFaultTrials(t, func(admin *pgxpool.Pool, w *stockWorker, blocked []int32, returned <-chan struct{}) error {
		for blocked == nil {
			select {
			case <-returned:
				return nil
			default:
			}
			_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'`, w.app)
			if err != nil {
				return err
			}
		}
		_, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid`, blocked)
		return err
	})
	if out != nil {
		out.figures(t, "conditional.Stock backend kill", "pg_terminate_backend")
	}
}

// Fault: the take's connection is cut (a proxy closes both ends), while
// the take waits on the row lock, or once at a random instant. A take cut while
// it waits goes on in its session once the lock is released, and commits:
// its caller, told ErrAmbiguousCommit, could not have been told more. See
// stockFaultTrials.
func TestStockConnectionCutTellsTheTruth(t *testing.T) {
	t.Parallel()
	out := stockFaultTrials(t, func(_ *pgxpool.Pool, w *stockWorker, _ []int32, _ <-chan struct{}) error {
		w.cut.Cut()
		return nil
	})
	if out != nil {
		out.figures(t, "conditional.Stock connection cut", "cut")
	}
}
