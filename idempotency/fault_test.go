package idempotency_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: the backend is terminated (pg_terminate_backend) while COMMIT
// runs, here held in a deferred trigger. The caller cannot know the outcome:
// ErrAmbiguousCommit. The commit did not happen, and a retry with the same
// key runs the payment exactly once.
func TestKilledDuringCommitConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	mustExec(t, b.pool, `CREATE TABLE fault (armed boolean NOT NULL)`)
	mustExec(t, b.pool, `INSERT INTO fault VALUES (true)`)
	mustExec(t, b.pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT armed FROM fault) THEN PERFORM pg_sleep(60); END IF;
  RETURN NULL;
END $$`)
	mustExec(t, b.pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ledger
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)

	done := make(chan error, 1)
	go func() {
		_, err := b.payOnce(ctx, "pay-1", 500)
		done <- err
	}()
	killed := false
	for i := 0; i < 500 && !killed; i++ {
		time.Sleep(10 * time.Millisecond)
		err := b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
WHERE application_name = $1 AND wait_event = 'PgSleep' AND query ILIKE 'commit%'`, b.schema).Scan(&killed)
		if err != nil {
			t.Fatal(err)
		}
	}
	if !killed {
		t.Fatal("COMMIT never reached the deferred trigger")
	}
	err := <-done
	if !errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Do whose backend died in COMMIT: %v, want ErrAmbiguousCommit", err)
	}
	mustExec(t, b.pool, `UPDATE fault SET armed = false`)
	b.check(0, initial) // the kill came before the commit record

	res, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || res.Replayed {
		t.Fatalf("retry: %+v, %v; want a fresh run", res, err)
	}
	res, err = b.payOnce(ctx, "pay-1", 500)
	if err != nil || !res.Replayed {
		t.Fatalf("second retry: %+v, %v; want a replay", res, err)
	}
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (the killed one and the retry)", n)
	}
	b.check(1, initial-500)
}

// Fault: COMMIT succeeds but its reply never reaches the client (the
// connection drops right after). The caller gets ErrAmbiguousCommit; the
// effect is there, and a retry with the same key replays it rather than
// paying twice.
func TestLostCommitReplyConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	p := newCommitDropper(t, b.schema, "COMMIT")
	store, err := idempotency.New(testenv.Pool(t, p.dsn, 2))
	if err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	_, err = store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), b.pay("alice", "pay-1", 500))
	if !errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Do whose COMMIT reply was lost: %v, want ErrAmbiguousCommit", err)
	}
	if p.dropped.Load() != 1 {
		t.Fatalf("the proxy dropped %d COMMIT replies, want 1", p.dropped.Load())
	}
	b.check(1, initial-500) // committed

	res, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || !res.Replayed || string(res.Body) != "paid pay-1 500" {
		t.Fatalf("retry: %+v, %v; want a replay", res, err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(1, initial-500)
}

// Fault: Exec's statement commits but its reply never reaches the client,
// under either plan. ErrAmbiguousCommit; the debit is there, once, and a
// retry with the same key replays it.
func TestExecLostReplyConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	forEachPlan(t, func(t *testing.T, pin func(*idempotency.Store)) {
		ctx := context.Background()
		b := newBed(t)
		p := newCommitDropper(t, b.schema, "INSERT 0 1")
		store, err := idempotency.New(testenv.Pool(t, p.dsn, 2))
		if err != nil {
			t.Fatal(err)
		}
		pin(store)
		pay := func() (idempotency.Result, error) {
			return store.Exec(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), debitSQL, "alice", int64(500))
		}
		p.armed.Store(true)
		if _, err := pay(); !errors.Is(err, idempotency.ErrAmbiguousCommit) || p.dropped.Load() != 1 {
			t.Fatalf("Exec whose reply was lost: %v (%d replies dropped), want ErrAmbiguousCommit after 1", err, p.dropped.Load())
		}
		if got := b.balance("alice"); got != initial-500 {
			t.Fatalf("balance %d after the lost reply, want %d: the debit committed", got, initial-500)
		}
		if res, err := pay(); err != nil || !res.Replayed {
			t.Fatalf("retry: %+v, %v; want a replay", res, err)
		}
		if got := b.balance("alice"); got != initial-500 {
			t.Fatalf("balance %d after the retry, want %d: one debit", got, initial-500)
		}
	})
}

// commitDropper is a TCP proxy in front of the test's PostgreSQL. Once
// armed, it swallows the first reply that reports a committed transaction
// (CommandComplete with tag: "COMMIT", or "INSERT 0 1" for Exec's
// statement, whose implicit transaction commits before the reply leaves)
// and closes that connection: the server has committed, the client never
// hears it.
type commitDropper struct {
	dsn     string
	tag     []byte
	armed   atomic.Bool
	dropped atomic.Int64
}

func newCommitDropper(t *testing.T, schema, tag string) *commitDropper {
	t.Helper()
	p := &commitDropper{tag: append([]byte(tag), 0)}
	p.dsn = testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), nil, p.relay)
	return p
}

// relay copies the server's messages (a type byte, a 4-byte length that
// counts itself, the body) to the client, except the armed drop.
func (p *commitDropper) relay(client io.Writer, server io.Reader) {
	var head [5]byte
	for {
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if head[0] == 'C' && bytes.Equal(body, p.tag) && p.armed.CompareAndSwap(true, false) {
			p.dropped.Add(1)
			return
		}
		if _, err := client.Write(append(head[:], body...)); err != nil {
			return
		}
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
					time.Sleep(20 * time.Millisecond)
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
	t.Logf("%d calls failed across the crash and were retried (%d of them ErrAmbiguousCommit); %d payments answered twice each",
		failed.Load(), ambiguous.Load(), payments)
}
