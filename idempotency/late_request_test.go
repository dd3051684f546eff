package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// lateClient is a trial worker's client whose network to PostgreSQL a
// test can hold: a Gate in a proxy, and a Store on a pool of one
// connection through it.
type lateClient struct {
	gate  *testenv.Gate
	pool  *pgxpool.Pool
	store *idempotency.Store
	pin   func(*idempotency.Store)
}

func newLateClients(t *testing.T, schema string, n int, pin func(*idempotency.Store)) []lateClient {
	t.Helper()
	cs := make([]lateClient, n)
	for i := range cs {
		cs[i].gate = testenv.NewGate()
		dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), cs[i].gate.Relay(), nil)
		cs[i].pool = testenv.Pool(t, dsn, 1)
		store, err := idempotency.New(cs[i].pool)
		if err != nil {
			t.Fatal(err)
		}
		cs[i].store, cs[i].pin = store, pin
	}
	return cs
}

// payCall is one way to pay through a Store: Do or Exec.
type payCall func(ctx context.Context, s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error)

// lateRequestTrials runs the late-request trials of one way to pay, on
// workers of their own, and returns how many ran. A trial:
//
//  1. The late client's gate shuts, and it calls: its request leaves and
//     is held in the network. Its context ends (as at a deadline) while
//     the request is held, and it returns: ErrAmbiguousCommit if what is
//     held may commit (writeHeld), else an error that is not ambiguous
//     (the held request is a read, or a transaction whose COMMIT was never
//     sent); never success.
//  2. A retry of the same call, on another connection, runs the payment:
//     the late request has not reached the server, so there is no record.
//  3. The gate opens: the late request reaches the server, well after its
//     caller gave up and after the retry committed. The key's record,
//     committed by the retry, refuses it: the payment takes effect once,
//     and the record is the retry's.
//  4. The late client asks again with the same key: a replay of the
//     retry's result.
func lateRequestTrials(t *testing.T, b *bed, clients []lateClient, writeHeld bool, call payCall) (trials int) {
	t.Helper()
	ctx := context.Background()
	wallets := b.openWallets(len(clients))
	trials = testenv.Trials(4, 1000)
	testenv.RunTrials(t, trials, len(clients), func(w, i int) {
		c := clients[w]
		account, payment, amount := wallets[w], fmt.Sprint("pay-", i), int64(1+i%5)
		if c.pin != nil {
			c.pin(c.store) // Exec's plan follows what its calls find
		}
		// The late client's connection is up (after a failed trial it
		// may have been closed) and its statements prepared, so that
		// the call's first bytes are its request.
		if _, err := call(ctx, c.store, account, fmt.Sprint("warm-", w), 1); err != nil {
			t.Errorf("%s: warming the late client: %v", payment, err)
			return
		}
		var pid uint32
		if err := c.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Error(err)
			return
		}
		before, _, err := b.paid(account, payment)
		if err != nil {
			t.Error(err)
			return
		}

		c.gate.Shut()
		defer c.gate.Open()
		lctx, giveUp := context.WithCancel(ctx)
		late := make(chan error, 1)
		go func() {
			_, err := call(lctx, c.store, account, payment, amount)
			late <- err
		}()
		err = testenv.Poll(payment+"'s request is held in the network", func() (bool, error) { return c.gate.Held() > 0, nil })
		giveUp()
		if err != nil {
			t.Error(err)
			return
		}
		if lateErr := <-late; lateErr == nil || errors.Is(lateErr, idempotency.ErrAmbiguousCommit) != writeHeld {
			t.Errorf("%s: the late caller, its request held: %v; want ErrAmbiguousCommit: %v", payment, lateErr, writeHeld)
			return
		}

		retry, err := call(ctx, b.store, account, payment, amount)
		if err != nil || retry.Replayed {
			t.Errorf("%s: the retry while the first request is held: %+v, %v; want a fresh run", payment, retry, err)
			return
		}

		c.gate.Open()
		// The late request has been answered once the late client's
		// connection is back in its pool (a statement whose caller stopped
		// waiting runs on to its end: writeHeld), or else once its session
		// has ended: the client closed the connection when it gave up, and
		// the server reads that only after the held bytes.
		err = testenv.Poll(payment+"'s late request is answered", func() (bool, error) {
			if writeHeld {
				return c.pool.Stat().AcquiredConns() == 0, nil
			}
			var sessions int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&sessions)
			return sessions == 0, err
		})
		if err != nil {
			var state string // what the late session was doing, for the failure's reader
			if serr := b.pool.QueryRow(ctx, `SELECT format('%s, waiting for %s %s, running %s', state, wait_event_type, wait_event, query)
FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state); serr != nil {
				state = "not read: " + serr.Error()
			}
			t.Errorf("%v (the late session: %s; %d chunks held in the gate)", err, state, c.gate.Held())
			return
		}
		balance, rows, err := b.paid(account, payment)
		if err == nil && (balance != before-amount || rows > 1) {
			err = fmt.Errorf("balance %d (was %d), %d ledger rows; want one payment of %d", balance, before, rows, amount)
		}
		if err != nil {
			t.Errorf("%s after the late request: %v", payment, err)
			return
		}
		res, err := call(ctx, c.store, account, payment, amount)
		if err != nil || !res.Replayed || string(res.Body) != string(retry.Body) || !res.CreatedAt.Equal(retry.CreatedAt) {
			t.Errorf("%s: the late client asks again: %+v, %v; want a replay of the retry's %+v", payment, res, err, retry)
		}
	})
	return trials
}

// lateCommitTrials runs the late-commit trials of Do, on workers of their
// own, and returns how many ran. A trial:
//
//  1. The late client's Do runs its payment; as fn returns, the gate
//     shuts, so the COMMIT (with the record) leaves and is held in the
//     network. The caller's context ends while it is held: Do returns
//     ErrAmbiguousCommit, since the COMMIT was sent.
//  2. A retry of the same payment, on another connection, meets the key
//     claimed by the late transaction, still open on the server: it waits,
//     bounded by its WithWait, and returns ErrInProgress, having run
//     nothing.
//  3. The gate opens: the late COMMIT lands, and commits the payment.
//  4. The retry, sent again, replays the late client's result: the
//     payment took effect once.
func lateCommitTrials(t *testing.T, b *bed, clients []lateClient, retrier *idempotency.Store) (trials int) {
	t.Helper()
	ctx := context.Background()
	wallets := b.openWallets(len(clients))
	trials = testenv.Trials(4, 1000)
	testenv.RunTrials(t, trials, len(clients), func(w, i int) {
		c := clients[w]
		account, payment, amount := wallets[w], fmt.Sprint("pay-", i), int64(1+i%5)
		fp := fingerprint(account, payment, amount)
		before, _, err := b.paid(account, payment)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.gate.Open()
		pay := b.pay(account, payment, amount)
		lctx, giveUp := context.WithCancel(ctx)
		late := make(chan error, 1)
		go func() {
			_, err := c.store.Do(lctx, account, payment, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				body, err := pay(ctx, tx)
				c.gate.Shut() // what Do sends next, the record and COMMIT, is held
				return body, err
			})
			late <- err
		}()
		err = testenv.Poll(payment+"'s COMMIT is held in the network", func() (bool, error) { return c.gate.Held() > 0, nil })
		giveUp()
		if err != nil {
			t.Error(err)
			return
		}
		if err := <-late; !errors.Is(err, idempotency.ErrAmbiguousCommit) {
			t.Errorf("%s: the late caller, its COMMIT held: %v; want ErrAmbiguousCommit", payment, err)
			return
		}
		if _, err := retrier.Do(ctx, account, payment, fp, b.pay(account, payment, amount)); !errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("%s: the retry while the late COMMIT is held: %v; want ErrInProgress", payment, err)
			return
		}
		c.gate.Open()
		err = testenv.Poll(payment+"'s late COMMIT is answered", func() (bool, error) { return c.pool.Stat().AcquiredConns() == 0, nil })
		if err != nil {
			t.Error(err)
			return
		}
		res, err := retrier.Do(ctx, account, payment, fp, b.pay(account, payment, amount))
		if err != nil || !res.Replayed || string(res.Body) != fmt.Sprintf("paid %s %d", payment, amount) {
			t.Errorf("%s: the retry after the late COMMIT landed: %+v, %v; want a replay", payment, res, err)
			return
		}
		if balance, rows, err := b.paid(account, payment); err != nil || balance != before-amount || rows != 1 {
			t.Errorf("%s: balance %d (was %d), %d ledger rows, %v; want one payment of %d", payment, balance, before, rows, err, amount)
		}
	})
	return trials
}

// Fault: a delayed network (a proxy that holds one client's request past
// its caller's deadline and past a retry, then delivers it). A late
// request is refused by the key's record that the retry committed (see
// lateRequestTrials); a late COMMIT holds the key, so the retry is
// refused until it lands, then replays it (see lateCommitTrials). One
// effect per key, whichever way the payment is made.
func TestLateRequestIsRefusedByTheKeysRecord(t *testing.T) {
	t.Parallel()
	figures := func(t *testing.T, trials int, writeHeld bool) {
		told := "a failure (its COMMIT or statement never sent)"
		if writeHeld {
			told = "ErrAmbiguousCommit"
		}
		testenv.Figures(t, "idempotency late request ("+strings.ReplaceAll(strings.TrimPrefix(t.Name(), "TestLateRequestIsRefusedByTheKeysRecord/"), "/", ", ")+")",
			"%d trials (request held past its caller's deadline and a retry's commit, then delivered): late callers told %s %d; late requests delivered %d, took effect 0 (the retry's record stood); 0 applied twice, 0 lost",
			trials, told, trials, trials)
	}
	t.Run("Do", func(t *testing.T) {
		t.Parallel()
		b := newBed(t)
		clients := newLateClients(t, b.schema, trialWorkers/2, nil)
		trials := lateRequestTrials(t, b, clients, false, func(ctx context.Context, s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error) {
			return s.Do(ctx, account, payment, fingerprint(account, payment, amount), b.pay(account, payment, amount))
		})
		if !t.Failed() {
			figures(t, trials, false)
		}
	})
	t.Run("DoCommit", func(t *testing.T) {
		t.Parallel()
		b := newBed(t)
		clients := newLateClients(t, b.schema, trialWorkers/2, nil)
		retrier, err := idempotency.New(b.pool, idempotency.WithWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		trials := lateCommitTrials(t, b, clients, retrier)
		if !t.Failed() {
			b.checkWallets(int64(trials))
			testenv.Figures(t, "idempotency late COMMIT (Do)", "%d trials (COMMIT held past its caller's deadline): late callers told ErrAmbiguousCommit %d; retries while held told ErrInProgress %d (nothing run); late COMMITs landed %d; retries after replayed %d; 0 applied twice, 0 lost",
				trials, trials, trials, trials, trials)
		}
	})
	t.Run("Exec", func(t *testing.T) {
		t.Parallel()
		forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
			b := newBed(t)
			clients := newLateClients(t, b.schema, trialWorkers/4, pin)
			trials := lateRequestTrials(t, b, clients, false, func(ctx context.Context, s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error) {
				return s.Exec(ctx, account, payment, fingerprint(account, payment, amount), debitSQL, account, amount)
			})
			if !t.Failed() {
				figures(t, trials, false)
			}
		})
	})
}
