package deploytest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/pgoutcome"
)

// The failover suite: a primary with a synchronous standby (testenv.PGPair)
// under load from failoverWorkers workers, each retrying its own calls,
// while the test kills the primary and promotes the standby, again and
// again (the old primary rebuilt as the new standby in between). Every
// other failover first stalls the standby, so that commits wait for it
// (SyncRep) until their callers' deadlines pass and the primary dies with
// them. The load, by turns:
//
//   - wallet payments, half through idempotency.Store.Do and half through
//     Store.Exec: each a key of its own that debits the worker's account
//     and adds a ledger row. A payment is retried with its key until it
//     returns success (first run or replay).
//   - stock sales: conditional.Stock.Take of one unit of the current
//     round's SKU; retried only when nothing was sent; a unit is counted
//     sold only on success.
//   - fenced writes: conditional.Fenced.Update of one of a few rows, with a
//     token from one rising counter; retried with the same token until the
//     answer is definite (written or ErrFenced).
//
// After each failover the workers finish their calls and pause, and the
// new primary must hold every acknowledged effect exactly once: every
// payment answered success has one ledger row and one debit, balances plus
// ledger are conserved, no key applied twice; every unit sold is taken, no
// more are taken than sold plus the takes answered unknown, and none past
// the stock; every fenced write answered success is in the row's log, the
// tokens on a row never go down, and the row carries the last one. A
// caller told something the database contradicts is counted too: a
// payment whose success is a replay though no earlier attempt of it was
// answered unknown, a fenced write answered ErrFenced (or refused) that is
// in the log, a sale answered sold out while units remain.

// failoverWorkers is how many workers load the pair.
const failoverWorkers = 20

// TestFailoverDirect: clients reach the pair through a multi-host DSN
// (target_session_attrs=read-write), in pgx's default mode.
func TestFailoverDirect(t *testing.T) {
	t.Parallel()
	runFailovers(t, "direct")
}

// TestFailoverPgBouncer: clients reach the primary through a PgBouncer of
// the test's own (transaction pooling, pgx's exec mode), moved to the
// promoted standby after each failover.
func TestFailoverPgBouncer(t *testing.T) {
	t.Parallel()
	runFailovers(t, "pgbouncer")
}

// runFailovers runs the suite in deployment dep: a few failovers in the
// default suite, 12 under NOLOCK_STRESS=1, alternately without and with a
// stalled standby.
func runFailovers(t *testing.T, dep string) {
	rounds := testenv.Trials(2, 12)
	b := newFailoverBed(t, dep, rounds)
	b.start()
	defer b.stop()
	for r := 0; r < rounds; r++ {
		stalled := stalledRound(r)
		b.progress("calls answered before failover "+strconv.Itoa(r), 150)
		if stalled {
			b.pair.StallStandby()
			testenv.Until(t, "a commit waits for the stalled standby", b.syncRepWaiting)
			mark := b.unknowns.Load()
			testenv.Until(t, "calls answered unknown while the standby is stalled", func() (bool, error) {
				return b.unknowns.Load() >= mark+10, nil
			})
		}
		old := b.pair.PrimaryDSN()
		b.pair.KillPrimary()
		b.pair.Promote()
		if b.bouncer != nil {
			b.bouncer.Retarget(b.pair.PrimaryDSN())
		}
		b.progress("calls answered by the new primary after failover "+strconv.Itoa(r), 100)
		b.gate.pause()
		b.check(fmt.Sprintf("after failover %d (stalled %v)", r, stalled))
		b.round.Add(1)
		if r+1 == rounds {
			break
		}
		b.gate.resume()
		waitReaped(t, old)
		b.pair.Rebuild()
	}
	b.stop()
	for _, stalled := range []bool{false, true} {
		s := b.tally[stalled]
		if s.failovers == 0 {
			continue
		}
		testenv.Figures(t, fmt.Sprintf("failover %s stalled=%v", dep, stalled),
			"%d failovers, %d calls, %d acknowledged (%d replays), %d ambiguous, %d replays held for the standby, %d payments rerun after an unknown answer, %d lost, %d doubled, %d told wrong, %d undercut",
			s.failovers, s.calls, s.acked, s.replays, s.ambiguous, s.held, s.rerun, s.lost, s.doubled, s.wrong, s.undercut)
	}
}

// stalledRound says whether failover r stalls the standby first.
func stalledRound(r int) bool { return r%2 == 1 }

// failoverBed is one deployment of the pair under load, and what its
// callers were told.
type failoverBed struct {
	t       *testing.T
	dep     string
	pair    *testenv.PGPair
	bouncer *testenv.PGBouncerProc // nil when direct
	schema  string
	pool    *pgxpool.Pool
	store   *idempotency.Store
	stock   *conditional.Stock
	fenced  *conditional.Fenced
	attempt time.Duration // each call's deadline
	opLimit time.Duration // how long a worker tries one operation

	round    atomic.Int32 // failovers checked so far: the round calls belong to
	tokens   atomic.Int64
	acks     atomic.Int64 // calls answered success, every kind: the progress probe
	unknowns atomic.Int64 // calls answered unknown

	gate    pauser
	stopped atomic.Bool
	wg      sync.WaitGroup

	mu       sync.Mutex
	payments []*payment
	sales    map[string]*sales     // by SKU
	writes   map[int64]*fenceWrite // by token
	tally    map[bool]*tally       // by stalled
	seen     map[string]bool       // problems reported already
}

// tally counts one scenario's calls (an attempt of an operation is a call)
// and, from the checks, what went wrong.
type tally struct {
	failovers                              int
	calls, acked, ambiguous, replays, held int64
	rerun                                  int // payments answered unknown, then run afresh: their first commit was lost
	lost, doubled, wrong, undercut         int
}

type payment struct {
	key      string
	round    int // the round it was answered success in
	account  int
	amount   int64
	exec     bool
	unknown  bool // an attempt was answered unknown
	acked    bool
	replayed bool
}

type sales struct {
	sold, ambiguous, soldOut, refused int64
}

type fenceWrite struct {
	row     int
	token   int64
	unknown bool   // an attempt was answered unknown
	answer  string // "ok", "fenced", "refused" or "" while in flight
}

const (
	accountStart = 1_000_000_000
	fencedRows   = 4
	skuStock     = 150
	payScope     = "pay"
	execPaySQL   = `INSERT INTO ledger (key, account, amount, via) VALUES ($1, $2, $3, 'exec') RETURNING amount`
)

// failoverSchema is the load's tables. An Exec payment is one statement,
// its ledger row, whose trigger debits the account; a Do payment debits
// and adds its row itself. Each fenced row's writes are logged, in commit
// order (a row's writers queue on its lock, and the log id is drawn under
// it).
const failoverSchema = `
CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text NOT NULL,
  account int NOT NULL, amount bigint NOT NULL, via text NOT NULL);
CREATE FUNCTION ledger_debit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN UPDATE accounts SET balance = balance - NEW.amount WHERE id = NEW.account; RETURN NULL; END $$;
CREATE TRIGGER ledger_debit AFTER INSERT ON ledger FOR EACH ROW WHEN (NEW.via = 'exec') EXECUTE FUNCTION ledger_debit();
CREATE TABLE fenced (k int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0, v bigint NOT NULL DEFAULT 0);
CREATE TABLE fenced_log (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, k int NOT NULL, token bigint NOT NULL);
CREATE FUNCTION fenced_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO fenced_log (k, token) VALUES (NEW.k, NEW.fence); RETURN NULL; END $$;
CREATE TRIGGER fenced_logged AFTER UPDATE ON fenced FOR EACH ROW EXECUTE FUNCTION fenced_logged();
`

func newFailoverBed(t *testing.T, dep string, rounds int) *failoverBed {
	t.Helper()
	b := &failoverBed{
		t: t, dep: dep, attempt: testenv.Scale(500 * time.Millisecond), opLimit: testenv.Scale(time.Minute),
		sales: map[string]*sales{}, writes: map[int64]*fenceWrite{},
		tally: map[bool]*tally{false: {}, true: {}}, seen: map[string]bool{},
	}
	b.gate.cond = sync.NewCond(&b.gate.mu)
	if dep == "pgbouncer" {
		testenv.PgBouncerDSN(t) // skips or fails, naming scripts/services, without the service
	}
	b.pair = testenv.PostgresPair(t)
	b.schema = b.pair.CreateSchema()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	admin := b.admin(ctx)
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, failoverSchema); err != nil {
		t.Fatal(err)
	}
	stmts := []string{
		fmt.Sprintf(`INSERT INTO accounts SELECT g, %d FROM generate_series(0, %d) g`, accountStart, failoverWorkers-1),
		fmt.Sprintf(`INSERT INTO fenced (k) SELECT g FROM generate_series(0, %d) g`, fencedRows-1),
	}
	if _, err := admin.Exec(ctx, strings.Join(stmts, ";")); err != nil {
		t.Fatal(err)
	}
	switch dep {
	case "direct":
		b.pool = testenv.PoolMode(t, b.pair.DSNFor(b.schema), pgx.QueryExecModeCacheStatement, failoverWorkers)
	case "pgbouncer":
		b.bouncer = testenv.PgBouncerServer(t, b.pair.PrimaryDSN())
		b.pool = testenv.PoolMode(t, b.bouncer.DSNFor(b.schema), pgx.QueryExecModeExec, failoverWorkers)
	default:
		t.Fatalf("unknown deployment %q", dep)
	}
	var err error
	if b.store, err = idempotency.New(b.pool); err != nil {
		t.Fatal(err)
	}
	if b.stock, err = conditional.NewStock(b.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.stock.Close() })
	if b.fenced, err = conditional.NewFenced("fenced", "k", "fence"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.stock.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rounds; r++ {
		b.sales[sku(r)] = &sales{}
		if _, err := admin.Exec(ctx, `INSERT INTO nolock_stock (key, bucket, qty) VALUES ($1, 0, $2)`, sku(r), skuStock); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// sku is round r's SKU: stock takes go to the current round's.
func sku(r int) string { return "sku-" + strconv.Itoa(r) }

// admin connects to the current primary, in the test's schema.
func (b *failoverBed) admin(ctx context.Context) *pgx.Conn {
	b.t.Helper()
	var conn *pgx.Conn
	testenv.Until(b.t, "a connection to the primary", func() (bool, error) {
		var err error
		conn, err = pgx.Connect(ctx, b.pair.DSNFor(b.schema))
		return err == nil, nil
	})
	return conn
}

// syncRepWaiting reports whether a session of the test's schema on the
// primary has a commit waiting for the standby.
func (b *failoverBed) syncRepWaiting() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(10*time.Second))
	defer cancel()
	n, err := syncRepWaiters(ctx, b.pair.PrimaryDSN(), b.schema)
	return n > 0, err
}

// syncRepWaiters counts the sessions named application (the schema, see
// DSNFor) on the server dsn names whose commit waits for the synchronous
// standby. Behind PgBouncer the sessions are PgBouncer's, named by the
// role: the count then takes the role's too.
func syncRepWaiters(ctx context.Context, dsn, application string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event = 'SyncRep' AND (application_name = $1 OR usename = $1)`, application).Scan(&n)
	return n, err
}

// progress waits until n more calls than now have been answered success.
func (b *failoverBed) progress(what string, n int64) {
	b.t.Helper()
	mark := b.acks.Load()
	testenv.Until(b.t, what, func() (bool, error) { return b.acks.Load() >= mark+n, nil })
}

// start starts the workers.
func (b *failoverBed) start() {
	for w := 0; w < failoverWorkers; w++ {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for seq := 0; ; seq++ {
				if b.gate.enter(); b.stopped.Load() {
					b.gate.leave()
					return
				}
				switch (w + seq) % 4 {
				case 0, 1:
					b.pay(w, seq)
				case 2:
					b.sell()
				case 3:
					b.write()
				}
				b.gate.leave()
				if b.t.Failed() {
					return
				}
			}
		}()
	}
}

// stop makes the workers end after their current operation, and waits for
// them. It may be called more than once.
func (b *failoverBed) stop() {
	b.stopped.Store(true)
	b.gate.resume()
	b.wg.Wait()
}

// answered counts a call's answer for the current round's scenario.
func (b *failoverBed) answered(err error, ambiguous bool) {
	switch {
	case err == nil:
		b.acks.Add(1)
	case ambiguous:
		b.unknowns.Add(1)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.tally[stalledRound(int(b.round.Load()))]
	s.calls++
	switch {
	case err == nil:
		s.acked++
	case ambiguous:
		s.ambiguous++
	}
}

// retryPause paces a worker's retries of one operation.
func retryPause() { time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond) }

// pay makes worker w's payment seq, through Do or Exec by turns, retrying
// with its key until it is answered success.
func (b *failoverBed) pay(w, seq int) {
	p := &payment{key: fmt.Sprintf("w%d-%d", w, seq), account: w, amount: int64(1 + seq%5), exec: seq%4 >= 2}
	b.mu.Lock()
	b.payments = append(b.payments, p)
	b.mu.Unlock()
	fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $2 WHERE id = $1`, p.account, p.amount); err != nil {
			return nil, err
		}
		_, err := tx.Exec(ctx, `INSERT INTO ledger (key, account, amount, via) VALUES ($1, $2, $3, 'do')`, p.key, p.account, p.amount)
		return []byte("paid"), err
	}
	began := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), b.attempt)
		var res idempotency.Result
		var err error
		if p.exec {
			res, err = b.store.Exec(ctx, payScope, p.key, nil, execPaySQL, p.key, p.account, p.amount)
		} else {
			res, err = b.store.Do(ctx, payScope, p.key, nil, fn)
		}
		cancel()
		unknown := errors.Is(err, idempotency.ErrAmbiguousCommit) || errors.Is(err, pgoutcome.ErrStoppedWaiting)
		b.answered(err, unknown)
		switch {
		case err == nil:
			b.mu.Lock()
			p.acked, p.replayed, p.round = true, res.Replayed, int(b.round.Load())
			switch tl := b.tally[stalledRound(p.round)]; {
			case res.Replayed:
				tl.replays++
			case p.unknown:
				tl.rerun++
			}
			b.mu.Unlock()
			return
		case unknown:
			b.mu.Lock()
			p.unknown = true
			if !errors.Is(err, idempotency.ErrAmbiguousCommit) { // a replay's wait for the standby
				b.tally[stalledRound(int(b.round.Load()))].held++
			}
			b.mu.Unlock()
		case errors.Is(err, idempotency.ErrMismatch) || errors.Is(err, idempotency.ErrInvalid):
			b.t.Errorf("payment %s: %v", p.key, err)
			return
		}
		// Anything else (ErrInProgress, a rollback, nothing sent) ran
		// nothing that committed: the same key is sent again.
		if time.Since(began) > b.opLimit {
			b.t.Errorf("payment %s (exec %v): no success within %v; last answer: %v", p.key, p.exec, b.opLimit, err)
			return
		}
		retryPause()
	}
}

// sell takes one unit of the current round's SKU; it sends the take again
// only when the first was not sent.
func (b *failoverBed) sell() {
	key := sku(int(b.round.Load()))
	b.mu.Lock()
	s := b.sales[key]
	b.mu.Unlock()
	began := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), b.attempt)
		err := b.stock.Take(ctx, key, 1)
		cancel()
		ambiguous := errors.Is(err, conditional.ErrAmbiguousCommit)
		b.answered(err, ambiguous)
		b.mu.Lock()
		switch {
		case err == nil:
			s.sold++
		case errors.Is(err, conditional.ErrSoldOut):
			s.soldOut++
		case ambiguous:
			s.ambiguous++
		case pgoutcome.Of(err) == pgoutcome.NotSent && time.Since(began) < b.opLimit:
			b.mu.Unlock()
			retryPause()
			continue
		default:
			s.refused++
		}
		b.mu.Unlock()
		return
	}
}

// write writes a fresh token to one of the fenced rows, sending it again
// with the same token until the answer is definite.
func (b *failoverBed) write() {
	tok := b.tokens.Add(1)
	fw := &fenceWrite{row: int(tok % fencedRows), token: tok}
	b.mu.Lock()
	b.writes[tok] = fw
	b.mu.Unlock()
	began := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), b.attempt)
		err := b.fenced.Update(ctx, b.pool, fw.row, tok, map[string]any{"v": tok})
		cancel()
		ambiguous := errors.Is(err, conditional.ErrAmbiguousCommit)
		b.answered(err, ambiguous)
		answer := ""
		switch {
		case err == nil:
			answer = "ok"
		case errors.Is(err, conditional.ErrFenced):
			answer = "fenced"
		case ambiguous:
		case pgoutcome.Of(err) == pgoutcome.NotSent:
		default:
			answer = "refused"
		}
		b.mu.Lock()
		fw.unknown = fw.unknown || ambiguous
		fw.answer = answer
		b.mu.Unlock()
		if answer != "" {
			return
		}
		if time.Since(began) > b.opLimit {
			b.t.Errorf("fenced write %d: no definite answer within %v; last: %v", tok, b.opLimit, err)
			return
		}
		retryPause()
	}
}

// check compares what the callers were told with what the primary holds;
// the workers are paused.
func (b *failoverBed) check(when string) {
	t := b.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	conn := b.admin(ctx)
	defer conn.Close(ctx)
	// One snapshot for every read.
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.tally[stalledRound(int(b.round.Load()))]
	s.failovers++
	problem := func(kind *int, id, format string, args ...any) {
		if b.seen[id] {
			return
		}
		b.seen[id] = true
		*kind++
		t.Errorf("%s, %s: %s", b.dep, when, fmt.Sprintf(format, args...))
	}

	// Payments.
	ledger := map[string]int{}
	rows, _ := tx.Query(ctx, `SELECT key, count(*) FROM ledger GROUP BY key`)
	var key string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&key, &n}, func() error { ledger[key] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	records := map[string]bool{}
	rows, _ = tx.Query(ctx, `SELECT key FROM nolock_idempotency WHERE scope = $1`, payScope)
	if _, err := pgx.ForEachRow(rows, []any{&key}, func() error { records[key] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	var total, unbalanced int64
	if err := tx.QueryRow(ctx, `SELECT (SELECT sum(balance) FROM accounts) + (SELECT coalesce(sum(amount), 0) FROM ledger),
  (SELECT count(*) FROM accounts a WHERE balance <> $1 - (SELECT coalesce(sum(amount), 0) FROM ledger l WHERE l.account = a.id))`,
		accountStart).Scan(&total, &unbalanced); err != nil {
		t.Fatal(err)
	}
	if want := int64(accountStart * failoverWorkers); total != want || unbalanced != 0 {
		problem(&s.doubled, "balance", "balances plus ledger = %d, want %d; %d accounts whose debits differ from their ledger rows", total, want, unbalanced)
	}
	for _, p := range b.payments {
		n := ledger[p.key]
		switch {
		case n > 1:
			problem(&s.doubled, "pay "+p.key, "payment %s (exec %v) applied %d times", p.key, p.exec, n)
		case p.acked && n == 0:
			problem(&s.lost, "pay "+p.key, "payment %s (exec %v) answered success (replayed %v) is not on the new primary", p.key, p.exec, p.replayed)
		case records[p.key] != (n == 1):
			problem(&s.doubled, "pay "+p.key, "payment %s (exec %v): %d ledger rows but record %v", p.key, p.exec, n, records[p.key])
		case p.acked && p.replayed && !p.unknown:
			problem(&s.wrong, "pay "+p.key, "payment %s (exec %v) was replayed, though no earlier attempt was answered unknown", p.key, p.exec)
		}
		delete(ledger, p.key)
	}
	for key, n := range ledger {
		problem(&s.doubled, "pay "+key, "ledger rows (%d) for key %s that no worker sent", n, key)
	}

	// Stock.
	rows, _ = tx.Query(ctx, `SELECT key, qty FROM nolock_stock`)
	var qty int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &qty}, func() error {
		c := b.sales[key]
		taken := skuStock - qty
		switch {
		case c == nil:
			return fmt.Errorf("stock row %q that the test did not make", key)
		case taken < c.sold:
			problem(&s.lost, "sku lost "+key, "%s: %d units sold, %d taken", key, c.sold, taken)
		case taken > c.sold+c.ambiguous:
			problem(&s.doubled, "sku doubled "+key, "%s: %d units taken, %d sold and %d answered unknown", key, taken, c.sold, c.ambiguous)
		case c.soldOut > 0 && qty > 0:
			problem(&s.wrong, "sku soldout "+key, "%s: %d takes answered sold out, %d units left", key, c.soldOut, qty)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Fenced writes: the log in commit order, per row.
	logged := map[int64]bool{}
	last := map[int]int64{}
	var row int
	var token int64
	rows, _ = tx.Query(ctx, `SELECT k, token FROM fenced_log ORDER BY id`)
	if _, err := pgx.ForEachRow(rows, []any{&row, &token}, func() error {
		if token < last[row] {
			problem(&s.undercut, fmt.Sprintf("undercut %d", token), "row %d written with token %d after token %d", row, token, last[row])
		}
		last[row], logged[token] = max(last[row], token), true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rows, _ = tx.Query(ctx, `SELECT k, fence FROM fenced`)
	if _, err := pgx.ForEachRow(rows, []any{&row, &token}, func() error {
		if token != last[row] {
			problem(&s.undercut, fmt.Sprintf("fence %d", row), "row %d carries token %d, its log's highest is %d", row, token, last[row])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for tok, fw := range b.writes {
		switch {
		case fw.answer == "ok" && !logged[tok]:
			problem(&s.lost, fmt.Sprintf("fenced %d", tok), "fenced write %d on row %d answered success is not on the new primary", tok, fw.row)
		case (fw.answer == "fenced" || fw.answer == "refused") && !fw.unknown && logged[tok]:
			problem(&s.wrong, fmt.Sprintf("fenced %d", tok), "fenced write %d on row %d answered %s was written", tok, fw.row, fw.answer)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d payments, %d fenced writes; checked", when, len(b.payments), len(b.writes))
}

// pauser holds workers between operations while the test checks.
type pauser struct {
	mu     sync.Mutex
	cond   *sync.Cond
	paused bool
	busy   int
}

// enter waits while paused, then counts the caller busy until leave.
func (p *pauser) enter() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.paused {
		p.cond.Wait()
	}
	p.busy++
}

func (p *pauser) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.busy--
	p.cond.Broadcast()
}

// pause returns once no worker is inside an operation, and keeps them out
// until resume.
func (p *pauser) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for p.busy > 0 {
		p.cond.Wait()
	}
}

func (p *pauser) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = false
	p.cond.Broadcast()
}

// waitReaped returns once the postmaster of the killed server dsn named is
// gone for good, not a zombie: its socket lock file names its pid, and a
// server started on that port (Rebuild) refuses to start while a process
// with that pid exists.
func waitReaped(t *testing.T, dsn string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	locks, _ := filepath.Glob(filepath.Join(os.TempDir(), "nolock-pg-*", ".s.PGSQL."+strconv.Itoa(int(cfg.Port))+".lock"))
	for _, lock := range locks {
		text, err := os.ReadFile(lock)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(text), "\n", 2)[0]))
		if err != nil {
			continue
		}
		testenv.Until(t, "the killed postmaster is reaped", func() (bool, error) {
			_, err := os.Stat("/proc/" + strconv.Itoa(pid))
			return os.IsNotExist(err), nil
		})
	}
}
