package pgbouncertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// bed is one schema's patterns on one pool.
type bed struct {
	pool   *pgxpool.Pool
	admin  *pgxpool.Pool // direct, for the test's own reads and races
	stock  *conditional.Stock
	acc    *conditional.Accounts
	holds  *conditional.Holds
	fenced *conditional.Fenced
	casB   *pgcas.Backend
	cas    *cas.Store[int]
	idem   *idempotency.Store
	locks  *lease.Client
	// own prefixes the arguments of the test's own statements (those
	// nolock does not send): exec mode behind PgBouncer in cache_statement,
	// where named statements do not survive a transaction, else nothing.
	own []any
}

// newBed makes the patterns' tables in a fresh schema and opens a pool of
// 8 connections in mode on it, through PgBouncer or directly.
func newBed(t *testing.T, viaPgBouncer bool, mode pgx.QueryExecMode) *bed {
	t.Helper()
	ctx := context.Background()
	admin, schema := testenv.PostgresSchema(t, 4)
	dsn := testenv.PostgresDSNFor(t, schema)
	if viaPgBouncer {
		dsn = testenv.PgBouncerDSNFor(t, schema)
	}
	b := &bed{pool: testenv.PoolMode(t, dsn, mode, 8), admin: admin}
	if viaPgBouncer && mode == pgx.QueryExecModeCacheStatement {
		b.own = []any{pgx.QueryExecModeExec}
	}
	var err error
	// The schema is made directly, in the default mode: the test is of
	// the patterns' statements, not of CreateSchema.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	stock, err := conditional.NewStock(admin, conditional.WithBuckets(2))
	must(err)
	must(stock.CreateSchema(ctx))
	must(stock.Close())
	holds, err := conditional.NewHolds(admin)
	must(err)
	must(holds.CreateSchema(ctx))
	be, err := pgcas.NewBackend(admin)
	must(err)
	must(be.CreateSchema(ctx))
	idem, err := idempotency.New(admin)
	must(err)
	must(idem.CreateSchema(ctx))
	locks, err := lease.New(admin)
	must(err)
	must(locks.CreateSchema(ctx))
	must(locks.Close())
	_, err = admin.Exec(ctx, `CREATE TABLE accts (LIKE nolock_stock INCLUDING ALL);
ALTER TABLE accts RENAME COLUMN qty TO balance;
CREATE TABLE leases (k text PRIMARY KEY, fence bigint NOT NULL DEFAULT 0, owner text);
CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL);
CREATE TABLE docs (id text PRIMARY KEY, body text NOT NULL, version bigint NOT NULL);
CREATE TABLE reports (id text PRIMARY KEY, body text NOT NULL)`)
	must(err)

	if b.stock, err = conditional.NewStock(b.pool, conditional.WithBuckets(2)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.stock.Close() })
	if b.acc, err = conditional.NewAccounts(b.pool, conditional.WithTable("accts")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.acc.Close() })
	if b.holds, err = conditional.NewHolds(b.pool); err != nil {
		t.Fatal(err)
	}
	if b.fenced, err = conditional.NewFenced("leases", "k", "fence"); err != nil {
		t.Fatal(err)
	}
	if b.casB, err = pgcas.NewBackend(b.pool); err != nil {
		t.Fatal(err)
	}
	if b.cas, err = cas.NewStore[int](b.casB, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.cas.Close() })
	if b.idem, err = idempotency.New(b.pool); err != nil {
		t.Fatal(err)
	}
	if b.locks, err = lease.New(b.pool, lease.WithLease(testenv.Scale(time.Minute))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.locks.Close() })
	return b
}

// vias are the deployments: PostgreSQL directly, and behind PgBouncer.
var vias = []struct {
	name      string
	pgbouncer bool
}{{"direct", false}, {"pgbouncer", true}}

// Every public entry point of every PostgreSQL pattern does its job behind
// PgBouncer in each pgx mode that PgBouncer 1.18 can serve (all but
// cache_statement; in describe_exec the patterns send their statements
// outside a transaction in exec mode), and directly in every mode. Eight
// workers run the scenarios at once on distinct keys, so that PgBouncer
// hands each client's transactions to many server connections.
func TestPatternsInEveryMode(t *testing.T) {
	t.Parallel()
	for _, via := range vias {
		for _, mode := range testenv.QueryExecModes {
			if via.pgbouncer && mode == pgx.QueryExecModeCacheStatement {
				continue // TestCacheStatementBehindPgBouncerFallsBack
			}
			t.Run(via.name+"/"+strings.ReplaceAll(mode.String(), " ", "_"), func(t *testing.T) {
				t.Parallel()
				b := newBed(t, via.pgbouncer, mode)
				var wg sync.WaitGroup
				errs := make(chan error, 64)
				for w := range 8 {
					wg.Go(func() {
						for _, sc := range scenarios {
							if err := sc.run(context.Background(), b, fmt.Sprintf("w%d", w)); err != nil {
								errs <- fmt.Errorf("%s (worker %d): %w", sc.name, w, err)
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Error(err)
				}
			})
		}
	}
}

// scenario is one pattern's entry points, on keys prefixed with w, checked
// against what each must do.
type scenario struct {
	name string
	run  func(ctx context.Context, b *bed, w string) error
}

// want returns nil if err is target (nil for success), else an error
// naming the step.
func want(step string, err, target error) error {
	if target == nil && err != nil || target != nil && !errors.Is(err, target) {
		return fmt.Errorf("%s: %v, want %v", step, err, target)
	}
	return nil
}

var scenarios = []scenario{
	{"conditional.Stock", func(ctx context.Context, b *bed, w string) error {
		k := w + "-sku"
		var n int64
		err := errors.Join(
			want("Put", b.stock.Put(ctx, k, 5), nil),
			want("Take", b.stock.Take(ctx, k, 2), nil),
			want("Take past the stock", b.stock.Take(ctx, k, 4), conditional.ErrSoldOut),
			want("Take of an unknown key", b.stock.Take(ctx, w+"-none", 1), conditional.ErrNotFound),
			want("TakeIn", pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.stock.TakeIn(ctx, tx, k, 1) }), nil),
		)
		if err != nil {
			return err
		}
		if n, err = b.stock.Available(ctx, k); err != nil || n != 2 {
			return fmt.Errorf("Available: %d, %v; want 2", n, err)
		}
		// Two units in two buckets: a take of both goes across them.
		if err := want("Take across buckets", b.stock.Take(ctx, k, 2), nil); err != nil {
			return err
		}
		if n, err = b.stock.Available(ctx, k); err != nil || n != 0 {
			return fmt.Errorf("Available after all sold: %d, %v; want 0", n, err)
		}
		return nil
	}},
	{"conditional.Accounts", func(ctx context.Context, b *bed, w string) error {
		k := w + "-acct"
		err := errors.Join(
			want("Open", b.acc.Open(ctx, k, 10), nil),
			want("Debit", b.acc.Debit(ctx, k, 4), nil),
			want("Debit past the balance", b.acc.Debit(ctx, k, 7), conditional.ErrInsufficient),
			want("Credit", b.acc.Credit(ctx, k, 1), nil),
			want("DebitIn", pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.acc.DebitIn(ctx, tx, k, 2) }), nil),
			want("CreditIn", pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return b.acc.CreditIn(ctx, tx, k, 3) }), nil),
		)
		if err != nil {
			return err
		}
		if n, err := b.acc.Balance(ctx, k); err != nil || n != 8 {
			return fmt.Errorf("Balance: %d, %v; want 8", n, err)
		}
		return nil
	}},
	{"conditional.Holds", func(ctx context.Context, b *bed, w string) error {
		r1, r2, r3 := w+"-seat1", w+"-seat2", w+"-seat3"
		if err := want("Add", b.holds.Add(ctx, r1, r2, r3), nil); err != nil {
			return err
		}
		_, herr := b.holds.Hold(ctx, r1, "ann", time.Minute)
		_, held := b.holds.Hold(ctx, r1, "bob", time.Minute)
		_, all := b.holds.HoldAll(ctx, []string{r2, r3}, "bob", time.Minute)
		_, unknown := b.holds.Hold(ctx, w+"-none", "ann", time.Minute)
		err := errors.Join(
			want("Hold", herr, nil),
			want("Hold of a held seat", held, conditional.ErrHeld),
			want("HoldAll", all, nil),
			want("Hold of an unknown seat", unknown, conditional.ErrNotFound),
			want("Confirm", b.holds.Confirm(ctx, r1, "ann"), nil),
			want("Confirm by another", b.holds.Confirm(ctx, r2, "ann"), conditional.ErrNotHolder),
			want("Release", b.holds.Release(ctx, r3, "bob"), nil),
		)
		if err != nil {
			return err
		}
		// r1 confirmed by ann, r2 held by bob, r3 free: HoldAny can only
		// take r3, Get and Free read what the calls above did.
		got, _, anyErr := b.holds.HoldAny(ctx, []string{r1, r2, r3}, "cat", time.Minute)
		_, none, noneErr := b.holds.HoldAny(ctx, []string{r1, r2, r3}, "dan", time.Minute)
		if err := errors.Join(want("HoldAny", anyErr, nil), want("HoldAny with none free", noneErr, conditional.ErrHeld)); err != nil {
			return err
		}
		if got != r3 || !none.IsZero() {
			return fmt.Errorf("HoldAny got %q, want %q", got, r3)
		}
		s1, err1 := b.holds.Get(ctx, r1)
		s2, err2 := b.holds.Get(ctx, r2)
		free, err3 := b.holds.Free(ctx, []string{r3, r2, r1})
		if err := errors.Join(err1, err2, err3); err != nil {
			return err
		}
		if s1.Holder != "ann" || !s1.Confirmed || s2.Holder != "bob" || s2.Confirmed || s2.Until.IsZero() || len(free) != 0 {
			return fmt.Errorf("Get: %+v, %+v; Free: %v; want ann's confirmed, bob's held, none free", s1, s2, free)
		}
		return b.holds.Release(ctx, r3, "cat")
	}},
	{"conditional.Fenced", func(ctx context.Context, b *bed, w string) error {
		k := w + "-lease"
		if _, err := b.admin.Exec(ctx, `INSERT INTO leases (k) VALUES ($1)`, k); err != nil {
			return err
		}
		err := errors.Join(
			want("Update", b.fenced.Update(ctx, b.pool, k, 2, map[string]any{"owner": "new"}), nil),
			want("Update with an older token", b.fenced.Update(ctx, b.pool, k, 1, map[string]any{"owner": "old"}), conditional.ErrFenced),
			want("Update of an unknown key", b.fenced.Update(ctx, b.pool, w+"-none", 3, nil), conditional.ErrNotFound),
			want("Update in a transaction", pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				return b.fenced.Update(ctx, tx, k, 3, map[string]any{"owner": "tx"})
			}), nil),
		)
		if err != nil {
			return err
		}
		var owner string
		var fence int64
		if err := b.admin.QueryRow(ctx, `SELECT owner, fence FROM leases WHERE k = $1`, k).Scan(&owner, &fence); err != nil || owner != "tx" || fence != 3 {
			return fmt.Errorf("the lease: %q at %d, %v; want \"tx\" at 3", owner, fence, err)
		}
		return nil
	}},
	leaseScenario,
	{"cas.Store", func(ctx context.Context, b *bed, w string) error {
		k := w + "-counter"
		err := errors.Join(
			want("Create", b.cas.Create(ctx, k, 1), nil),
			want("Create of an existing key", b.cas.Create(ctx, k, 1), cas.ErrExists),
		)
		if err != nil {
			return err
		}
		conflicts := 0
		v, uerr := b.cas.Update(ctx, k, func(cur int) (int, error) {
			if conflicts == 0 {
				// Another writer moves the version on: this attempt
				// conflicts, and Update runs fn again on a fresh read.
				conflicts++
				if _, err := b.casB.Put(ctx, k, []byte("10"), 1); err != nil {
					return 0, err
				}
			}
			return cur + 1, nil
		}, cas.NoCoalescing())
		_, stale := b.casB.Put(ctx, k, []byte("0"), 1)
		if err := errors.Join(want("Update after a conflict", uerr, nil), want("Put at a stale version", stale, cas.ErrConflict)); err != nil {
			return err
		}
		if v.Value != 11 || v.Version != 3 || conflicts != 1 {
			return fmt.Errorf("Update: %+v after %d conflicts; want 11 at version 3 after 1", v, conflicts)
		}
		got, err := b.cas.Get(ctx, k)
		if err != nil || got != v {
			return fmt.Errorf("Get: %+v, %v; want %+v", got, err, v)
		}
		return errors.Join(
			want("Delete at a stale version", b.cas.Delete(ctx, k, 2), cas.ErrConflict),
			want("Delete", b.cas.Delete(ctx, k, 3), nil),
		)
	}},
	{"pgcas.Retry", func(ctx context.Context, b *bed, w string) error {
		id := w + "-doc"
		if _, err := b.admin.Exec(ctx, `INSERT INTO docs VALUES ($1, '', 1)`, id); err != nil {
			return err
		}
		attempts := 0 // that read the row
		err := pgcas.Retry(ctx, b.pool, func(ctx context.Context, tx pgx.Tx) error {
			var body string
			var version int64
			if err := tx.QueryRow(ctx, `SELECT body, version FROM docs WHERE id = $1`, id).Scan(&body, &version); err != nil {
				return err
			}
			attempts++
			if attempts == 1 { // another editor commits first
				if _, err := b.admin.Exec(ctx, `UPDATE docs SET body = 'other', version = version + 1 WHERE id = $1`, id); err != nil {
					return err
				}
			}
			return pgcas.Exec(ctx, tx, `UPDATE docs SET body = $1, version = version + 1 WHERE id = $2 AND version = $3`, body+"+mine", id, version)
		}, cas.WithBackoff(time.Millisecond, 5*time.Millisecond))
		var body string
		// Behind PgBouncer in cache_statement an attempt may also be made
		// again at once because a statement met a missing named statement
		// (it ran nothing): more reads, never another body.
		twice := attempts == 2 || b.own != nil && attempts > 2
		if qerr := b.admin.QueryRow(ctx, `SELECT body FROM docs WHERE id = $1`, id).Scan(&body); err != nil || qerr != nil || body != "other+mine" || !twice {
			return fmt.Errorf("Retry: %v (%v), body %q after %d attempts; want \"other+mine\" after 2", err, qerr, body, attempts)
		}
		return nil
	}},
	idempotencyScenario,
}

// In pgx's default mode, cache_statement, every statement is a named
// prepared statement, which PgBouncer 1.18 does not carry from one
// transaction's server connection to the next. Each pattern's value (a
// Stock, a Store, a Client: what it learns is its own) learns it from the
// first of its statements that fails so (having run nothing) and sends its
// statements unnamed from then on; a one-statement write that failed so
// is sent again at once, and so is pgcas.Retry's transaction. Until a value
// has learnt it, a call of it made in a transaction may fail, having run
// nothing, with an error that names the settings; afterwards every entry
// point works as in the other modes.
func TestCacheStatementBehindPgBouncerFallsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, true, pgx.QueryExecModeCacheStatement)
	// One bucket empty: takes that land on it go across buckets in a
	// transaction, which mixes server connections as users' load does.
	if _, err := b.admin.Exec(ctx, `INSERT INTO nolock_stock (key, bucket, qty) VALUES ('sku', 0, 1000000), ('sku', 1, 0)`); err != nil {
		t.Fatal(err)
	}
	var taken, refused atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 25 {
				switch err := b.stock.Take(ctx, "sku", 1); {
				case err == nil:
					taken.Add(1)
				case pgmode.MissingNamed(err) && !errors.Is(err, conditional.ErrAmbiguousCommit) &&
					strings.Contains(err.Error(), "default_query_exec_mode"):
					refused.Add(1)
				default:
					t.Errorf("Take: %v; want success or a refusal naming default_query_exec_mode", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d takes answered, %d refused while learning", taken.Load(), refused.Load())
	var left int64
	if err := b.admin.QueryRow(ctx, `SELECT sum(qty) FROM nolock_stock WHERE key = 'sku'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if 1000000-left != taken.Load() {
		t.Fatalf("%d takes answered, %d units gone", taken.Load(), 1000000-left)
	}
	if !dropsNamed(ctx, t, b.pool) {
		t.Fatal("PgBouncer kept a named prepared statement across transactions: the test shows nothing")
	}
	// Every scenario works; one that fails while its value is learning
	// (having run nothing, naming the settings) works when run again.
	var learnt atomic.Int64
	errs := make(chan error, 64)
	for w := range 8 {
		wg.Go(func() {
			for _, sc := range scenarios {
				err := sc.run(ctx, b, fmt.Sprintf("w%d", w))
				if err != nil && learning(err) {
					learnt.Add(1)
					err = sc.run(ctx, b, fmt.Sprintf("w%d-again", w))
				}
				if err != nil {
					errs <- fmt.Errorf("%s (worker %d): %w", sc.name, w, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	t.Logf("%d scenario runs refused while their values learnt", learnt.Load())
	for err := range errs {
		t.Error(err)
	}
}

// learning reports whether err is a refusal of a value still learning
// that its server connections drop named prepared statements: nothing
// ran, and the error names the settings (or, from a statement of the
// test's own in a callback, the SQLSTATE).
func learning(err error) bool {
	msg := err.Error()
	return !errors.Is(err, conditional.ErrAmbiguousCommit) && (strings.Contains(msg, "default_query_exec_mode") ||
		strings.Contains(msg, "SQLSTATE 26000") || strings.Contains(msg, "SQLSTATE 42P05"))
}

// dropsNamed reports whether pool's server connections drop pgx's named
// prepared statements between transactions: a statement prepared on one
// connection of the pool is run again while another connection holds, in
// a transaction, the server connection PgBouncer handed the first (it
// hands out the last one released first). Other tests share PgBouncer's
// server connections, so it tries a few times.
func dropsNamed(ctx context.Context, t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()
	for i := range 20 {
		q := fmt.Sprintf("SELECT $1::int + %d", i)
		if _, err := c1.Exec(ctx, q, pgx.QueryExecModeCacheStatement, 1); err != nil {
			t.Fatal(err)
		}
		tx, err := c2.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
		_, err = c1.Exec(ctx, q, pgx.QueryExecModeCacheStatement, 1)
		if rerr := tx.Rollback(ctx); rerr != nil {
			t.Fatal(rerr)
		}
		if pgmode.MissingNamed(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return false
}
