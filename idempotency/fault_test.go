package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// trialWallet is the opening balance of each worker's wallet in the
// fault trials: more than a thousand trials can spend.
const trialWallet = 1_000_000

// trialWorkers is how many trials run at once.
const trialWorkers = 8

// openWallets adds n wallets, "w0" to "w<n-1>", each holding trialWallet:
// one per trial worker, so that concurrent trials lock no common row.
func (b *bed) openWallets(n int) []string {
	b.t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprint("w", i)
		mustExec(b.t, b.pool, `INSERT INTO wallets VALUES ($1, $2)`, names[i], trialWallet)
	}
	return names
}

// paid returns account's balance and how many ledger rows payment has.
// Trials call it from their own goroutines, so it returns its error.
func (b *bed) paid(account, payment string) (balance, rows int64, err error) {
	err = b.pool.QueryRow(context.Background(), `SELECT (SELECT balance FROM wallets WHERE account = $1),
  (SELECT count(*) FROM ledger WHERE payment = $2)`, account, payment).Scan(&balance, &rows)
	return balance, rows, err
}

// checkWallets asserts, after the trials, that each wallet holds its
// opening balance less its ledger rows, and that there are want rows.
func (b *bed) checkWallets(want int64) {
	b.t.Helper()
	var rows, off int64
	err := b.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM ledger),
  (SELECT count(*) FROM wallets w WHERE account LIKE 'w%' AND balance <> $1 - (SELECT coalesce(sum(amount), 0) FROM ledger l WHERE l.account = w.account))`,
		trialWallet).Scan(&rows, &off)
	if err != nil {
		b.t.Fatal(err)
	}
	if rows != want || off != 0 {
		b.t.Fatalf("%d ledger rows, want %d; %d wallets whose balance is not their opening less their ledger", rows, want, off)
	}
}

// Fault: the backend is terminated (pg_terminate_backend) while its
// COMMIT runs, held there by a deferred trigger that sleeps for the
// trial's payment. The caller cannot know the outcome: ErrAmbiguousCommit.
// The commit did not happen, and a retry with the same key runs the
// payment exactly once, a second retry replays it. Trials run
// trialWorkers at a time, each worker on its own wallet; NOLOCK_STRESS=1
// runs a thousand.
func TestKilledDuringCommitConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	mustExec(t, b.pool, `CREATE TABLE fault (payment text PRIMARY KEY)`)
	mustExec(t, b.pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM fault WHERE payment = NEW.payment) THEN PERFORM pg_sleep(60); END IF;
  RETURN NULL;
END $$`)
	mustExec(t, b.pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ledger
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	wallets := b.openWallets(trialWorkers)
	trials := testenv.Trials(8, 1000)
	var ambiguous, ran, replayed atomic.Int64
	testenv.RunTrials(t, trials, trialWorkers, func(w, i int) {
		account, payment, amount := wallets[w], fmt.Sprint("pay-", i), int64(1+i%5)
		fp := fingerprint(account, payment, amount)
		before, _, err := b.paid(account, payment)
		if err == nil {
			_, err = b.pool.Exec(ctx, `INSERT INTO fault VALUES ($1)`, payment)
		}
		if err != nil {
			t.Error(err)
			return
		}
		pay := b.pay(account, payment, amount)
		pids, done := make(chan uint32, 1), make(chan error, 1)
		go func() {
			_, err := b.store.Do(ctx, account, payment, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				var pid uint32
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return nil, err
				}
				select {
				case pids <- pid:
				default:
				}
				return pay(ctx, tx)
			})
			done <- err
		}()
		var pid uint32
		select {
		case pid = <-pids:
		case err := <-done:
			t.Errorf("%s: Do returned %v before its fn ran", payment, err)
			return
		}
		err = testenv.Poll("the COMMIT of "+payment+" sleeps in its trigger", func() (bool, error) {
			var killed bool
			err := b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
WHERE pid = $1 AND wait_event = 'PgSleep' AND query ILIKE 'commit%'`, pid).Scan(&killed)
			return killed, err
		})
		if err != nil {
			t.Error(err)
			return
		}
		if err := <-done; !errors.Is(err, idempotency.ErrAmbiguousCommit) {
			t.Errorf("%s: Do whose backend died in COMMIT: %v, want ErrAmbiguousCommit", payment, err)
			return
		}
		ambiguous.Add(1)
		if balance, rows, err := b.paid(account, payment); err != nil || balance != before || rows != 0 {
			t.Errorf("%s after the kill: balance %d (was %d), %d ledger rows, %v; want nothing committed: the kill came before the commit record", payment, balance, before, rows, err)
			return
		}
		if _, err := b.pool.Exec(ctx, `DELETE FROM fault WHERE payment = $1`, payment); err != nil {
			t.Error(err)
			return
		}
		for _, wantReplay := range []bool{false, true} {
			res, err := b.store.Do(ctx, account, payment, fp, b.pay(account, payment, amount))
			if err != nil || res.Replayed != wantReplay || string(res.Body) != fmt.Sprintf("paid %s %d", payment, amount) {
				t.Errorf("%s: retry: %+v, %v; want replayed %v", payment, res, err, wantReplay)
				return
			}
			if wantReplay {
				replayed.Add(1)
			} else {
				ran.Add(1)
			}
		}
		if balance, rows, err := b.paid(account, payment); err != nil || balance != before-amount || rows != 1 {
			t.Errorf("%s after the retries: balance %d (was %d), %d ledger rows, %v; want one debit of %d", payment, balance, before, rows, err, amount)
		}
	})
	if t.Failed() {
		return
	}
	if n := b.calls.Load(); n != int64(2*trials) {
		t.Fatalf("fn ran %d times, want %d (the killed run and the retry, per trial)", n, 2*trials)
	}
	b.checkWallets(int64(trials))
	testenv.Figures(t, "idempotency backend kill", "%d trials (pg_terminate_backend in COMMIT): %d told ErrAmbiguousCommit, 0 committed; retries with the same key: %d ran once, %d replayed; 0 lost, 0 applied twice",
		trials, ambiguous.Load(), ran.Load(), replayed.Load())
}

// lostReplyWorker is a trial worker's own way to the database: a proxy
// whose ReplyDropper swallows the reply that reports its commit, and a
// Store on a pool of one connection through it.
type lostReplyWorker struct {
	drop  *testenv.ReplyDropper
	store *idempotency.Store
	pin   func(*idempotency.Store)
}

func newLostReplyWorkers(t *testing.T, schema, tag string, n int, pin func(*idempotency.Store)) []lostReplyWorker {
	t.Helper()
	ws := make([]lostReplyWorker, n)
	for i := range ws {
		ws[i].drop = testenv.DropReply(tag)
		dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), nil, ws[i].drop.Relay)
		store, err := idempotency.New(testenv.Pool(t, dsn, 1))
		if err != nil {
			t.Fatal(err)
		}
		ws[i].store, ws[i].pin = store, pin
	}
	return ws
}

// lostReplyTrials runs the lost-reply trials: call, through its worker's
// proxy armed to drop the reply of the commit, pays; the effect is there
// and the caller was told ErrAmbiguousCommit; the same call retried
// replays the payment and pays nothing more.
func lostReplyTrials(t *testing.T, b *bed, workers []lostReplyWorker, call func(s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error)) (trials int) {
	t.Helper()
	wallets := b.openWallets(len(workers))
	trials = testenv.Trials(8, 1000)
	testenv.RunTrials(t, trials, len(workers), func(w, i int) {
		account, payment, amount := wallets[w], fmt.Sprint("pay-", i), int64(1+i%5)
		wk := workers[w]
		before, _, err := b.paid(account, payment)
		if err != nil {
			t.Error(err)
			return
		}
		if wk.pin != nil {
			wk.pin(wk.store) // the Store's plan follows what its calls find; hold it
		}
		dropped := wk.drop.Dropped()
		wk.drop.Arm()
		if _, err := call(wk.store, account, payment, amount); !errors.Is(err, idempotency.ErrAmbiguousCommit) || wk.drop.Dropped() != dropped+1 {
			t.Errorf("%s: call whose reply was lost: %v (%d replies dropped), want ErrAmbiguousCommit after 1", payment, err, wk.drop.Dropped()-dropped)
			return
		}
		if balance, _, err := b.paid(account, payment); err != nil || balance != before-amount {
			t.Errorf("%s after the lost reply: balance %d (was %d), %v; want the debit of %d committed", payment, balance, before, err, amount)
			return
		}
		res, err := call(wk.store, account, payment, amount)
		if err != nil || !res.Replayed {
			t.Errorf("%s: retry: %+v, %v; want a replay", payment, res, err)
			return
		}
		if balance, _, err := b.paid(account, payment); err != nil || balance != before-amount {
			t.Errorf("%s after the retry: balance %d (was %d), %v; want one debit of %d", payment, balance, before, err, amount)
		}
	})
	return trials
}

// Fault: COMMIT succeeds but its reply never reaches the client (the
// connection drops right after). The caller gets ErrAmbiguousCommit; the
// effect is there, and a retry with the same key replays it rather than
// paying twice, whether Do claims the key first or reads its record first.
func TestLostCommitReplyConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	for _, readFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "claimfirst", true: "readfirst"}[readFirst], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := newBed(t)
			workers := newLostReplyWorkers(t, b.schema, "COMMIT", trialWorkers/2, func(s *idempotency.Store) { s.PinDoPlan(readFirst) })
			trials := lostReplyTrials(t, b, workers, func(s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error) {
				return s.Do(ctx, account, payment, fingerprint(account, payment, amount), b.pay(account, payment, amount))
			})
			if t.Failed() {
				return
			}
			if n := b.calls.Load(); n != int64(trials) {
				t.Fatalf("fn ran %d times, want %d: once per payment", n, trials)
			}
			b.checkWallets(int64(trials))
			testenv.Figures(t, "idempotency lost reply (Do, "+path.Base(t.Name())+")", "%d trials (COMMIT's reply dropped): %d told ErrAmbiguousCommit, all committed; %d retries replayed; 0 lost, 0 applied twice",
				trials, trials, trials)
		})
	}
}

// Fault: Exec's statement (or the COMMIT sent with it) commits but its
// reply never reaches the client, under each plan. ErrAmbiguousCommit;
// the debit is there, once, and a retry with the same key replays it.
func TestExecLostReplyConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		workers := newLostReplyWorkers(t, b.schema, "COMMIT", trialWorkers/2, pin)
		for i, w := range workers { // the statement described before any reply is dropped
			if _, err := w.store.Exec(ctx, "warm-up", fmt.Sprint(i), nil, debitSQL, "nobody", int64(0)); err != nil {
				t.Fatal(err)
			}
		}
		trials := lostReplyTrials(t, b, workers, func(s *idempotency.Store, account, payment string, amount int64) (idempotency.Result, error) {
			return s.Exec(ctx, account, payment, fingerprint(account, payment, amount), debitSQL, account, amount)
		})
		if !t.Failed() {
			testenv.Figures(t, "idempotency lost reply (Exec, "+path.Base(t.Name())+")", "%d trials (the statement's reply dropped): %d told ErrAmbiguousCommit, all committed; %d retries replayed; 0 lost, 0 applied twice",
				trials, trials, trials)
		}
	})
}

// Fault: the PostgreSQL server crashes (every server process killed at
// once, as by a power cut; a cluster of the test's own) while 16 workers
// pay 240 payments, each delivered twice, half through Exec and half
// through Do, each delivery retrying whatever error it gets. After the
// restart every payment has exactly one record and at most one effect:
// each balance is its opening balance less its paid payments, each paid
// Do payment has one ledger row, and both deliveries of a payment got the
// same answer.
func TestServerCrashConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
	defer cancel()
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 16)
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	const wallets, opening, payments, workers = 4, 1500, 240, 16
	mustExec(t, pool, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
	mustExec(t, pool, `INSERT INTO wallets SELECT 'w' || i, $1 FROM generate_series(0, $2 - 1) i`, opening, wallets)
	mustExec(t, pool, `CREATE TABLE ledger (payment text PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)`)

	type payment struct {
		key, account string
		amount       int64
		exec         bool
	}
	all := make([]payment, payments)
	for i := range all {
		all[i] = payment{fmt.Sprint("pay-", i), fmt.Sprint("w", i%wallets), int64(10 + i%51), i%2 == 0}
	}
	deliver := func(p payment) (idempotency.Result, error) {
		fp := fingerprint(p.account, p.key, p.amount)
		if p.exec {
			return store.Exec(ctx, p.account, p.key, fp, debitSQL, p.account, p.amount)
		}
		return store.Do(ctx, p.account, p.key, fp, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			tag, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - $2 WHERE account = $1 AND balance >= $2`, p.account, p.amount)
			if err == nil && tag.RowsAffected() == 0 {
				return []byte("declined"), idempotency.Terminal(errors.New("insufficient funds"))
			}
			if err == nil {
				_, err = tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, p.key, p.account, p.amount)
			}
			return []byte("paid"), err
		})
	}

	queue := make(chan int, 2*payments)
	for _, i := range rand.Perm(2 * payments) {
		queue <- i % payments
	}
	close(queue)
	var answered, failed, ambiguous atomic.Int64
	answers := make([][]idempotency.Result, payments)
	var mu sync.Mutex
	crash := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range queue {
				for {
					res, err := deliver(all[i])
					if err == nil {
						mu.Lock()
						answers[i] = append(answers[i], res)
						mu.Unlock()
						if answered.Add(1) == 2*payments/3 {
							close(crash)
						}
						break
					}
					if errors.Is(err, idempotency.ErrMismatch) || ctx.Err() != nil {
						t.Errorf("%s: %v", all[i].key, err)
						return
					}
					failed.Add(1)
					if errors.Is(err, idempotency.ErrAmbiguousCommit) {
						ambiguous.Add(1)
					}
					time.Sleep(20 * time.Millisecond) // the client's pause before it retries
				}
			}
		}()
	}
	<-crash
	srv.CrashFor(300 * time.Millisecond)
	wg.Wait()
	if t.Failed() {
		return
	}
	if failed.Load() == 0 {
		t.Fatal("the crash failed no call: the test tested nothing")
	}
	// Only a call in flight at the crash (or one more through a connection
	// that died idle) can end in ErrAmbiguousCommit; one that found the
	// server down sent nothing.
	if ambiguous.Load() > 2*workers {
		t.Fatalf("%d calls ended in ErrAmbiguousCommit, more than the %d that can have been in flight", ambiguous.Load(), 2*workers)
	}

	paid := map[string]int64{} // account -> sum of its paid payments
	var paidDo, records int64
	for i, res := range answers {
		p := all[i]
		if len(res) != 2 || !bytes.Equal(res[0].Body, res[1].Body) || res[0].Terminal != res[1].Terminal {
			t.Fatalf("%s: answers %+v, want two, the same", p.key, res)
		}
		if !res[0].Terminal {
			paid[p.account] += p.amount
			if !p.exec {
				paidDo++
			}
		}
	}
	for w := 0; w < wallets; w++ {
		account := fmt.Sprint("w", w)
		var balance int64
		if err := pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE account = $1`, account).Scan(&balance); err != nil {
			t.Fatal(err)
		}
		if balance != opening-paid[account] {
			t.Errorf("%s: balance %d, want %d less its paid payments %d", account, balance, opening, paid[account])
		}
	}
	var ledger int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM nolock_idempotency)`).Scan(&ledger, &records); err != nil {
		t.Fatal(err)
	}
	if ledger != paidDo || records != payments {
		t.Fatalf("%d ledger rows and %d records, want %d (paid through Do) and %d", ledger, records, paidDo, payments)
	}
	testenv.Figures(t, "idempotency server crash", "%d payments delivered twice each, half through Exec, half through Do: %d calls failed across the crash and were retried (%d of them ErrAmbiguousCommit, at most %d can be in flight); every payment one record, at most one effect, both deliveries the same answer",
		payments, failed.Load(), ambiguous.Load(), 2*workers)
}
