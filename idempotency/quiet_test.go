package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// Normal operation is quiet on the server: first runs, terminal outcomes,
// replays, mismatches, a concurrent duplicate that waits and then replays,
// and the takeover of an expired record, through Do, Exec (by default)
// and the HTTP middleware, write no ERROR line to the server's log and
// roll back no transaction. Operators alert on both; none of these is an
// error.
// Both of Do's plans are checked: claiming the key at once, and reading
// its record first (as Do does once replays dominate).
func TestNormalOutcomesAreQuietOnTheServer(t *testing.T) {
	t.Parallel()
	for _, readFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("readFirst=", readFirst), func(t *testing.T) {
			t.Parallel()
			dsn := testenv.PostgresDatabase(t)
			errorLines := testenv.ErrorLines(t, dsn)
			pool := testenv.Pool(t, dsn, 8)
			ctx := context.Background()
			store, err := idempotency.New(pool, idempotency.WithWait(testenv.Scale(30*time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			if err := store.CreateSchema(ctx); err != nil {
				t.Fatal(err)
			}
			store.PinDoPlan(readFirst)
			mustExec(t, pool, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
			mustExec(t, pool, `INSERT INTO wallets VALUES ('alice', 100)`)
			quietDo(t, pool, store)
			quietExec(t, pool, store)
			quietMixed(t, pool, store)
			quietMiddleware(t, store)
			pool.Close()
			if n := errorLines(); n != 0 {
				t.Errorf("%d ERROR lines in the server's log, want 0", n)
			}
			if n := testenv.Rollbacks(t, dsn); n != 0 {
				t.Errorf("%d transactions rolled back on the server, want 0", n)
			}
		})
	}
}

// quietDo runs Do's normal outcomes, checking each.
func quietDo(t *testing.T, pool *pgxpool.Pool, store *idempotency.Store) {
	ctx := context.Background()
	debit := func(amount int64) idempotency.Func {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			err := debit(ctx, tx, "alice", amount)
			if errors.Is(err, errInsufficient) {
				return []byte("declined"), idempotency.Terminal(err)
			}
			return []byte("paid"), err
		}
	}
	do := func(key, fp string, fn idempotency.Func, wantBody string, wantReplayed bool) {
		t.Helper()
		res, err := store.Do(ctx, "quiet", key, []byte(fp), fn)
		if err != nil || string(res.Body) != wantBody || res.Replayed != wantReplayed {
			t.Fatalf("Do(%s, %s): %q replayed %v, %v; want %q replayed %v", key, fp, res.Body, res.Replayed, err, wantBody, wantReplayed)
		}
	}
	do("first", "a", debit(10), "paid", false)
	do("first", "a", debit(10), "paid", true)
	do("declined", "a", debit(1000), "declined", false)
	do("declined", "a", debit(1000), "declined", true)
	if _, err := store.Do(ctx, "quiet", "first", []byte("other"), debit(10)); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Do with another fingerprint: %v, want ErrMismatch", err)
	}

	// A duplicate arrives while the first is running: it waits on the key,
	// then replays the first's result.
	started, hold := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := store.Do(ctx, "quiet", "dup", []byte("a"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			close(started) // the key is claimed
			<-hold
			return debit(10)(ctx, tx)
		})
		first <- err
	}()
	<-started
	busy := store.BusyAttempts()
	second := make(chan idempotency.Result, 1)
	go func() {
		res, err := store.Do(ctx, "quiet", "dup", []byte("a"), debit(10))
		if err != nil {
			t.Error(err)
		}
		second <- res
	}()
	waitBusy(t, store, "the duplicate waiting for the key", busy)
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if res := <-second; !res.Replayed || string(res.Body) != "paid" {
		t.Fatalf("duplicate: %q replayed %v; want the first's result replayed", res.Body, res.Replayed)
	}

	mustExec(t, pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s' WHERE key = 'first'`)
	do("first", "b", debit(10), "paid", false) // the expired record taken over
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM wallets`).Scan(&balance); err != nil || balance != 70 {
		t.Fatalf("balance %d (%v), want 70: three debits of 10", balance, err)
	}
}

// quietExec runs Exec's normal outcomes, checking each. Alice has 70.
func quietExec(t *testing.T, pool *pgxpool.Pool, store *idempotency.Store) {
	ctx := context.Background()
	exec := func(key, fp string, amount int64, wantBody string, wantReplayed bool) {
		t.Helper()
		res, err := store.Exec(ctx, "quiet-exec", key, []byte(fp), quietDebitSQL, amount)
		if err != nil || string(res.Body) != wantBody || res.Replayed != wantReplayed {
			t.Fatalf("Exec(%s, %s): %q replayed %v, %v; want %q replayed %v", key, fp, res.Body, res.Replayed, err, wantBody, wantReplayed)
		}
	}
	const paid = `[{"paid":"paid"}]`
	exec("first", "a", 10, paid, false)
	exec("first", "a", 10, paid, true)
	exec("declined", "a", 1000, "[]", false)
	exec("declined", "a", 1000, "[]", true)
	if _, err := store.Exec(ctx, "quiet-exec", "first", []byte("other"), quietDebitSQL, int64(10)); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Exec with another fingerprint: %v, want ErrMismatch", err)
	}

	// The first of two duplicates waits for alice's row, which another
	// transaction holds, with the key claimed; the second waits on the key,
	// then replays the first's result. The holder commits, as it would.
	holder := holdAlice(t, pool)
	busy := store.BusyAttempts()
	results := make(chan idempotency.Result, 2)
	for range 2 {
		go func() {
			res, err := store.Exec(ctx, "quiet-exec", "dup", []byte("a"), quietDebitSQL, int64(10))
			if err != nil {
				t.Error(err)
			}
			results <- res
		}()
	}
	lockWaiters(t, pool, "the first waiting for alice's row", 1, nil)
	waitBusy(t, store, "the second waiting for the key", busy)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b := <-results, <-results; a.Replayed == b.Replayed || string(a.Body) != paid || string(b.Body) != paid {
		t.Fatalf("duplicates: %q replayed %v and %q replayed %v; want one run and its replay", a.Body, a.Replayed, b.Body, b.Replayed)
	}

	mustExec(t, pool, `UPDATE nolock_idempotency SET expires_at = now() - interval '1 s' WHERE scope = 'quiet-exec' AND key = 'first'`)
	exec("first", "b", 10, paid, false) // the expired record taken over
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM wallets`).Scan(&balance); err != nil || balance != 40 {
		t.Fatalf("balance %d (%v), want 40: three more debits of 10", balance, err)
	}
}

// quietDebitSQL debits alice $1 through Exec.
const quietDebitSQL = `UPDATE wallets SET balance = balance - $1 WHERE account = 'alice' AND balance >= $1 RETURNING 'paid' AS paid`

// lockWaiters waits until n sessions of the database wait for a lock, or
// until stopped (if not nil) says a call returned early.
func lockWaiters(t *testing.T, pool *pgxpool.Pool, what string, n int, stopped func() bool) {
	t.Helper()
	testenv.Until(t, what, func() (bool, error) {
		var waiting int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return waiting == n || stopped != nil && stopped(), err
	})
}

// quietMixed runs duplicates of a key through Do and Exec, each arriving
// while the other runs: the duplicate waits on the key, then replays the
// first's result. Alice has 40.
func quietMixed(t *testing.T, pool *pgxpool.Pool, store *idempotency.Store) {
	ctx := context.Background()
	type outcome struct {
		res idempotency.Result
		err error
	}
	notRun := func(context.Context, pgx.Tx) ([]byte, error) { return nil, errors.New("fn ran for a duplicate") }
	// both returns the outcomes of the first call and of its duplicate.
	both := func(first, second <-chan outcome) (outcome, outcome) {
		t.Helper()
		var o [2]outcome
		for i, ch := range []<-chan outcome{first, second} {
			select {
			case o[i] = <-ch:
			case <-time.After(testenv.Scale(time.Minute)):
				t.Fatal("a call did not return within a minute")
			}
		}
		return o[0], o[1]
	}

	// Do first: its fn holds the key; Exec waits, then replays Do's result.
	started, hold := make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release() // on a failure too, so that Do ends and pool.Close returns
	first, second := make(chan outcome, 1), make(chan outcome, 1)
	go func() {
		res, err := store.Do(ctx, "quiet-mixed", "do-first", []byte("a"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			close(started)
			<-hold
			return []byte("paid"), debit(ctx, tx, "alice", 10)
		})
		first <- outcome{res, err}
	}()
	select {
	case <-started:
	case o := <-first:
		t.Fatalf("Do returned before its fn ran: %q, %v", o.res.Body, o.err)
	}
	busy := store.BusyAttempts()
	go func() {
		res, err := store.Exec(ctx, "quiet-mixed", "do-first", []byte("a"), quietDebitSQL, int64(10))
		second <- outcome{res, err}
	}()
	waitBusy(t, store, "Exec waiting for the key Do holds", busy)
	release()
	if o, d := both(first, second); o.err != nil || d.err != nil || o.res.Replayed || !d.res.Replayed || string(d.res.Body) != "paid" {
		t.Fatalf("Do then Exec: %q replayed %v (%v), then %q replayed %v (%v); want Do's run, then its replay", o.res.Body, o.res.Replayed, o.err, d.res.Body, d.res.Replayed, d.err)
	}

	// Exec first: its statement waits for alice's row, which another
	// transaction holds; Do waits on the key, then replays Exec's result.
	holder := holdAlice(t, pool)
	go func() {
		res, err := store.Exec(ctx, "quiet-mixed", "exec-first", []byte("a"), quietDebitSQL, int64(10))
		first <- outcome{res, err}
	}()
	lockWaiters(t, pool, "Exec waiting for alice's row", 1, func() bool { return len(first) > 0 })
	busy = store.BusyAttempts()
	go func() {
		res, err := store.Do(ctx, "quiet-mixed", "exec-first", []byte("a"), notRun)
		second <- outcome{res, err}
	}()
	waitBusy(t, store, "Do waiting for the key Exec holds", busy)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if o, d := both(first, second); o.err != nil || d.err != nil || o.res.Replayed || !d.res.Replayed || string(d.res.Body) != `[{"paid":"paid"}]` {
		t.Fatalf("Exec then Do: %q replayed %v (%v), then %q replayed %v (%v); want Exec's run, then its replay", o.res.Body, o.res.Replayed, o.err, d.res.Body, d.res.Replayed, d.err)
	}
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM wallets`).Scan(&balance); err != nil || balance != 20 {
		t.Fatalf("balance %d (%v), want 20: two debits of 10", balance, err)
	}
}

// quietMiddleware runs the middleware's normal outcomes: a first request,
// its replay, and the same key with another body (422).
func quietMiddleware(t *testing.T, store *idempotency.Store) {
	mw, err := idempotency.Middleware(store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idempotency.TxFromContext(r.Context())
		if err := debit(r.Context(), tx, "alice", 1); err != nil {
			http.Error(w, err.Error(), http.StatusPaymentRequired)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	for _, c := range []struct {
		body     string
		want     int
		replayed string
	}{{"a", http.StatusCreated, ""}, {"a", http.StatusCreated, "true"}, {"b", http.StatusUnprocessableEntity, ""}} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(c.body))
		req.Header.Set(idempotency.HeaderKey, "http-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want || resp.Header.Get("Idempotent-Replayed") != c.replayed {
			t.Fatalf("POST %q: %d, replayed %q; want %d, %q", c.body, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), c.want, c.replayed)
		}
	}
}

// Do and Exec racing on the same keys from many goroutines: each key's
// debit happens once, every call returns its run or a replay of it, and
// the server logs no ERROR and rolls back nothing. How often a Do and an
// Exec meet in flight depends on scheduling; quietMixed makes them meet.
func TestMixedDuplicatesAreQuiet(t *testing.T) {
	t.Parallel()
	const keys, callers = 24, 8
	dsn := testenv.PostgresDatabase(t)
	errorLines := testenv.ErrorLines(t, dsn)
	pool := testenv.Pool(t, dsn, callers+2)
	ctx := context.Background()
	store, err := idempotency.New(pool, idempotency.WithWait(testenv.Scale(30*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))`)
	mustExec(t, pool, `INSERT INTO wallets VALUES ('alice', 1000)`)
	var wg sync.WaitGroup
	runs := make([]atomic.Int32, keys) // first runs answered, per key
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range keys {
				key := fmt.Sprint("k", k) // every caller in the same order: they meet
				var res idempotency.Result
				var err error
				if (k+c)%2 == 0 {
					res, err = store.Do(ctx, "mixed", key, nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						return []byte(`[{"paid":"paid"}]`), debit(ctx, tx, "alice", 1)
					})
				} else {
					res, err = store.Exec(ctx, "mixed", key, nil, quietDebitSQL, int64(1))
				}
				if err != nil || string(res.Body) != `[{"paid":"paid"}]` {
					t.Errorf("%s: %q replayed %v, %v", key, res.Body, res.Replayed, err)
					return
				}
				if !res.Replayed {
					runs[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for k := range runs {
		if n := runs[k].Load(); n != 1 {
			t.Errorf("key k%d answered as a first run %d times, want 1", k, n)
		}
	}
	var balance int64
	if err := pool.QueryRow(ctx, `SELECT balance FROM wallets`).Scan(&balance); err != nil || balance != 1000-keys {
		t.Errorf("balance %d (%v), want %d: one debit per key", balance, err, 1000-keys)
	}
	pool.Close()
	if n := errorLines(); n != 0 {
		t.Errorf("%d ERROR lines in the server's log, want 0", n)
	}
	if n := testenv.Rollbacks(t, dsn); n != 0 {
		t.Errorf("%d transactions rolled back on the server, want 0", n)
	}
}
