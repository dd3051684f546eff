package deploytest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/pgoutcome"
)

// doOutcome is what one call of Do returned.
type doOutcome struct {
	res idempotency.Result
	err error
}

// TestReplayWaitsForStandby: a commit whose wait for the synchronous
// standby an operator cancels (pg_cancel_backend) stays, visible on the
// primary and absent from the standby. A retry with its key must not
// replay it as done while the standby lacks it: the replay waits for the
// standby (SyncRep) and, once the caller stops waiting, returns an error
// saying so, having run nothing. After the primary dies and the standby is
// promoted, the key is absent, and a retry runs the payment once: no
// caller was told "paid" by a replay of a payment the failover lost. For
// idempotency.Store.Do and Store.Exec, each claiming first, and reading
// first as they do once replays dominate.
//
// The call whose wait was cancelled is itself answered success: PostgreSQL
// answers its COMMIT with a WARNING and "COMMIT", and pgx passes the
// WARNING to the connection's OnNotice, not to the caller. The test logs
// that answer and the WARNING; it is the operator's cancel, not the
// library, that acknowledged it.
func TestReplayWaitsForStandby(t *testing.T) {
	t.Parallel()
	for _, api := range []string{"Do", "Do-readFirst", "Exec", "Exec-readFirst"} {
		t.Run(api, func(t *testing.T) {
			t.Parallel()
			replayWaitsForStandby(t, api)
		})
	}
}

func replayWaitsForStandby(t *testing.T, api string) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
	defer cancel()
	pair := testenv.PostgresPair(t)
	schema := pair.CreateSchema()

	var mu sync.Mutex
	var warnings []string
	cfg, err := pgxpool.ParseConfig(pair.DSNFor(schema))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		defer mu.Unlock()
		warnings = append(warnings, n.Severity+": "+n.Message+" ("+n.Detail+")")
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO wallets VALUES ('alice', 100)`); err != nil {
		t.Fatal(err)
	}
	// pay debits alice 10 with key k1; the balance in the database counts
	// its runs (and runs counts Do's).
	var runs atomic.Int32
	const debit = `UPDATE wallets SET balance = balance - $1 WHERE account = 'alice' RETURNING 'paid' AS paid`
	pay := func(ctx context.Context) (idempotency.Result, error) {
		if strings.HasPrefix(api, "Exec") {
			return store.Exec(ctx, "pay", "k1", nil, debit, 10)
		}
		return store.Do(ctx, "pay", "k1", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			runs.Add(1)
			_, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance - 10 WHERE account = 'alice'`)
			return []byte("paid"), err
		})
	}
	// Exec: its statement described before the standby stalls, by a debit
	// of nothing.
	if strings.HasPrefix(api, "Exec") {
		if _, err := store.Exec(ctx, "warm", "debit", nil, debit, 0); err != nil {
			t.Fatal(err)
		}
	}
	// -readFirst: one first run, then enough replays to turn the plan.
	for i := 0; strings.HasSuffix(api, "-readFirst") && i < 80; i++ {
		var err error
		if api == "Do-readFirst" {
			_, err = store.Do(ctx, "warm", "w", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
		} else {
			_, err = store.Exec(ctx, "warm", "w", nil, `SELECT 1 AS one`)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	paid := `paid`
	if strings.HasPrefix(api, "Exec") {
		paid = `[{"paid":"paid"}]`
	}
	// state reads the key's record count and alice's balance on the
	// server dsn names.
	state := func(dsn string) (records int, balance int64) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		q := `SELECT (SELECT count(*) FROM ` + pgx.Identifier{schema, "nolock_idempotency"}.Sanitize() + ` WHERE key = 'k1'),
  (SELECT balance FROM ` + pgx.Identifier{schema, "wallets"}.Sanitize() + ` WHERE account = 'alice')`
		if err := conn.QueryRow(ctx, q).Scan(&records, &balance); err != nil {
			t.Fatal(err)
		}
		return records, balance
	}
	testenv.Until(t, "the standby holds the wallet", func() (bool, error) {
		conn, err := pgx.Connect(ctx, pair.StandbyDSN())
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		var n int
		err = conn.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "wallets"}.Sanitize()).Scan(&n)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // not replayed yet
			return false, nil
		}
		return n == 1, err
	})

	// 1. The first payment's commit waits for the stalled standby, and an
	// operator cancels that wait.
	pair.StallStandby()
	first := make(chan doOutcome, 1)
	go func() { res, err := pay(ctx); first <- doOutcome{res, err} }()
	pid := syncRepPid(t, pair.PrimaryDSN(), schema)
	admin, err := pgx.Connect(ctx, pair.PrimaryDSN())
	if err != nil {
		t.Fatal(err)
	}
	var cancelled bool
	if err := admin.QueryRow(ctx, `SELECT pg_cancel_backend($1)`, pid).Scan(&cancelled); err != nil || !cancelled {
		t.Fatalf("pg_cancel_backend(%d) = %v, %v", pid, cancelled, err)
	}
	admin.Close(ctx)
	o := <-first
	mu.Lock()
	t.Logf("the call whose wait for the standby was cancelled got: result %q, replayed %v, error %v (pgoutcome %v); notices %q",
		o.res.Body, o.res.Replayed, o.err, pgoutcome.Of(o.err), warnings)
	mu.Unlock()
	if r, bal := state(pair.PrimaryDSN()); r != 1 || bal != 90 {
		t.Fatalf("on the primary after the cancelled wait: %d records, balance %d; want the commit there (1, 90)", r, bal)
	}
	if r, bal := state(pair.StandbyDSN()); r != 0 || bal != 100 {
		t.Fatalf("on the stalled standby: %d records, balance %d; want nothing of the commit (0, 100)", r, bal)
	}

	// 2. A retry while the standby still lacks the record waits for it
	// (SyncRep), and ends with "stopped waiting" when its caller stops.
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	second := make(chan doOutcome, 1)
	go func() { res, err := pay(rctx); second <- doOutcome{res, err} }()
	var early *doOutcome
	testenv.Until(t, "the retry waits for the standby, or returns", func() (bool, error) {
		select {
		case o := <-second:
			early = &o
			return true, nil
		default:
		}
		n, err := syncRepWaiters(ctx, pair.PrimaryDSN(), schema)
		return n > 0, err
	})
	acked := false // a retry answered success before the standby held the record
	if early != nil {
		acked = early.err == nil
		t.Errorf("the retry returned while the standby lacked the record: result %q, replayed %v, error %v; want it to wait for the standby",
			early.res.Body, early.res.Replayed, early.err)
	} else {
		rcancel()
		o := <-second
		t.Logf("the retry, cancelled while it waited for the standby: %v", o.err)
		if !errors.Is(o.err, pgoutcome.ErrStoppedWaiting) || !errors.Is(o.err, context.Canceled) ||
			!strings.Contains(o.err.Error(), "nothing was run") || pgoutcome.Of(o.err) != pgoutcome.Unknown {
			t.Errorf("the retry returned %v; want the stopped-waiting error (ErrStoppedWaiting, context.Canceled, unknown)", o.err)
		}
		// A short deadline ends the same way; on a busy machine it may end
		// sooner, still waiting for the cancelled retry's claim
		// (ErrInProgress) or for a connection: never with "paid".
		sctx, scancel := context.WithTimeout(ctx, testenv.Scale(time.Second))
		res, err := pay(sctx)
		scancel()
		t.Logf("a retry with a %v deadline: %v", testenv.Scale(time.Second), err)
		switch {
		case err == nil:
			acked = true
			t.Errorf("a retry with a short deadline returned result %q, replayed %v, while the standby lacked the record", res.Body, res.Replayed)
		case errors.Is(err, pgoutcome.ErrStoppedWaiting) && errors.Is(err, context.DeadlineExceeded):
		case errors.Is(err, idempotency.ErrInProgress), errors.Is(err, context.DeadlineExceeded) && pgoutcome.Of(err) != pgoutcome.Committed:
			t.Logf("the deadline ended before the retry reached the standby's wait")
		default:
			t.Errorf("a retry with a short deadline returned %v; want the stopped-waiting error", err)
		}
	}
	if n := runs.Load(); strings.HasPrefix(api, "Do") && n != 1 {
		t.Errorf("fn ran %d times before the failover; want 1", n)
	}
	if r, bal := state(pair.PrimaryDSN()); r != 1 || bal != 90 {
		t.Errorf("on the primary before the failover: %d records, balance %d; want the one payment (1, 90)", r, bal)
	}

	// 3. The primary dies; on the promoted standby the payment is absent,
	// and a retry runs fn once.
	pair.KillPrimary()
	pair.Promote()
	if r, bal := state(pair.PrimaryDSN()); r != 0 || bal != 100 {
		t.Fatalf("on the new primary: %d records, balance %d; want none of the unreplicated commit (0, 100)", r, bal)
	}
	if acked {
		t.Errorf("LOST: a retry was answered \"paid\" by a replay, and the payment is gone on the new primary")
	}
	var res idempotency.Result
	testenv.Until(t, "a retry on the new primary succeeds", func() (bool, error) {
		actx, acancel := context.WithTimeout(ctx, testenv.Scale(5*time.Second))
		defer acancel()
		var err error
		res, err = pay(actx)
		if err != nil {
			t.Logf("retry on the new primary: %v", err)
		}
		return err == nil, nil
	})
	if res.Replayed || string(res.Body) != paid || (strings.HasPrefix(api, "Do") && runs.Load() != 2) {
		t.Errorf("the retry on the new primary: result %q, replayed %v, fn ran %d times in all; want a first run (%q; Do: 2 runs in all)",
			res.Body, res.Replayed, runs.Load(), paid)
	}
	if r, bal := state(pair.PrimaryDSN()); r != 1 || bal != 90 {
		t.Errorf("on the new primary after the retry: %d records, balance %d; want one payment (1, 90)", r, bal)
	}
}

// syncRepPid waits until one session of application (the test's schema) on
// the server dsn names waits for the synchronous standby, and returns its
// pid.
func syncRepPid(t *testing.T, dsn, application string) int {
	t.Helper()
	var pid int
	testenv.Until(t, "a commit waits for the stalled standby", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(10*time.Second))
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		err = conn.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = $1`, application).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	return pid
}
