package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkDebit measures the seed's wallet debit with and without an
// idempotency key at 1, 4, 16 and 64 clients, each client on its own
// wallet (no row contention: what is measured is the key's own cost).
// Every scenario except the baselines runs interleaved with its baseline
// on the same pool, in rounds through every order (testenv.Rounds), and
// reports units/s and x-baseline (the median over the rounds of its rate
// over the baseline's in the same round), so drift on a shared machine
// cancels out:
//
//	bare       BEGIN; UPDATE wallets … balance >= $a; COMMIT (the baseline)
//	ledger     bare plus INSERT INTO ledger … ON CONFLICT DO NOTHING (the naive ledger)
//	forupdate  BEGIN; SELECT … FOR UPDATE; UPDATE; COMMIT
//	advisory   BEGIN; pg_advisory_xact_lock(key); SELECT the key; UPDATE; INSERT the key; COMMIT
//	do         Store.Do with the UPDATE as fn, a new key each time
//	exec       Store.Exec with the UPDATE … RETURNING, a new key each time
//	stmt       the UPDATE … RETURNING alone, autocommit, no key
//	exec-stmt  exec against stmt as its baseline: the key's cost over one statement
//	read       SELECT a stored result by key, no transaction (the baseline of replay)
//	replay     Store.Do on a key already used: the stored result, fn not run
//	           (after a few, Do reads first)
//	replay-claim  replay with Do kept claiming first, as a rare replay among
//	             first runs finds it
//	exec-replay  Store.Exec on a key already used (after a few, Exec reads first)
//	read-record  the read a replay needs: every column of the key's record, and whether it expired
//	exec-replay-record  exec-replay against read-record: what Exec adds to that read
//	exec-replay-claim  exec-replay with Exec kept claiming first, as a rare
//	             replay among first runs finds it
//	exec-v7    exec with keys that are UUIDv7s (time-ordered), against exec
//	           with random UUIDs (v4) as its baseline: what time-ordered keys
//	           do to the record's index inserts
//	ledger-v7  ledger with UUIDv7 payment keys against random UUIDs (v4): the
//	           same for the ledger's primary key
//	bound-do   no library and no lock: what a Do plan that reads the key
//	           before fn runs must do at least on a first run. [BEGIN; read
//	           the key's record] (fn is Go code: it may run only once that
//	           answer is back, or it would run on a replay), the UPDATE (fn),
//	           [INSERT the record; COMMIT]: bare's three round trips, one
//	           read and one insert more
//	bound-exec no library and no lock: what an Exec plan that creates
//	           nothing on the server must do at least. [BEGIN; read the key's record]
//	           (the statement may run only once that answer is back),
//	           [the UPDATE; INSERT the record; COMMIT]: two round trips
//	bound-do-lock  bound-do, against it, with what a plan with Do's
//	           guarantees must add: the key's lock, tried in the first round
//	           trip, so that two concurrent first runs of a key never both
//	           run fn (a read alone cannot tell them apart)
//	bound-exec-rows  bound-exec, against it, with what a plan with Exec's
//	           guarantees must add: the statement's RETURNING rows stored in
//	           the record it inserts (one statement, as a single round trip
//	           needs) and returned to the caller, and the key's lock
//
// do, exec, replay and exec-replay also report x-bound: the same median of
// their rate over that of the least any plan with their guarantees must
// do, measured in the same rounds (bound-do-lock, bound-exec-rows, and read-record for
// the replays), so 1.0 means the library adds nothing to that least.
// bound-do and bound-exec leave out what those guarantees need (the lock
// that keeps two concurrent first runs from both running; the statement's
// rows in the record): bound-do-lock and bound-exec-rows report, as their
// x-baseline, what that costs.
//
// Each scenario also reports, per operation of its own, the ERROR lines
// it made the server log (errors/op) and the transactions it rolled back
// (rollbacks/op), counted on a database of the benchmark's own: its
// baseline adds to neither.
func BenchmarkDebit(b *testing.B) {
	dsn := testenv.PostgresDatabase(b)
	errorLines := testenv.ErrorLines(b, dsn)
	pool := testenv.Pool(b, dsn, 80)
	benchDebit(b, pool, []int{1, 4, 16, 64}, nil, func() (errors, rollbacks int64) {
		pool.Reset() // every session ends, and so reports its counts
		return int64(errorLines()), testenv.Rollbacks(b, dsn)
	})
}

// BenchmarkDebitOverNetwork runs bare, do, exec, read, replay,
// replay-claim and exec-replay of BenchmarkDebit through a proxy that delays every chunk by
// 1 ms each way, as a database across a network would: on loopback a round
// trip costs next to nothing, so BenchmarkDebit weighs only server work.
// (Go's timers here round sleeps up to about a millisecond, so a shorter
// delay would not be one.)
func BenchmarkDebitOverNetwork(b *testing.B) {
	_, schema := testenv.PostgresSchema(b, 1)
	oneWay := testenv.Delay(time.Millisecond)
	dsn := testenv.Proxy(b, testenv.PostgresDSNFor(b, schema), oneWay, oneWay)
	benchDebit(b, testenv.Pool(b, dsn, 80), []int{1, 16, 64}, []string{"bare", "do", "exec", "read", "replay", "replay-claim", "exec-replay"}, nil)
}

// benchDebit runs the scenarios named in only (nil: all) on pool. When
// counts is not nil, it gives the server's ERROR lines and rolled-back
// transactions so far, and each scenario reports its own per operation.
func benchDebit(b *testing.B, pool *pgxpool.Pool, clientCounts []int, only []string, counts func() (errors, rollbacks int64)) {
	ctx := context.Background()
	store, err := idempotency.New(pool)
	if err != nil {
		b.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		b.Fatal(err)
	}
	mustExec(b, pool, `CREATE TABLE wallets (account text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0)) WITH (fillfactor = 70)`)
	mustExec(b, pool, `INSERT INTO wallets SELECT 'w' || i, 1e15 FROM generate_series(0, 63) i`)
	mustExec(b, pool, `CREATE TABLE ledger (payment text PRIMARY KEY, amount bigint NOT NULL)`)
	const debit = `UPDATE wallets SET balance = balance - 1 WHERE account = $1 AND balance >= 1`
	wallet := func(c int) string { return fmt.Sprint("w", c) }
	var seq atomic.Int64
	next := func(prefix string) string { return fmt.Sprintf("%s-%d", prefix, seq.Add(1)) }
	debited := func(tx pgx.Tx, ctx context.Context, c int) error {
		tag, err := tx.Exec(ctx, debit, wallet(c))
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("not debited")
		}
		return err
	}
	type op func(ctx context.Context, client int) error
	const replayKeys = 1000
	for i := 0; i < replayKeys; i++ {
		if _, err := store.Do(ctx, "bench", fmt.Sprint("old-", i), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return []byte("paid"), debited(tx, ctx, 0)
		}); err != nil {
			b.Fatal(err)
		}
	}

	bare := func(ctx context.Context, c int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return debited(tx, ctx, c) })
	}
	const debitReturning = debit + ` RETURNING balance`
	stmt := func(ctx context.Context, c int) error {
		var n int64
		return pool.QueryRow(ctx, debitReturning, wallet(c)).Scan(&n)
	}
	read := func(ctx context.Context, c int) error {
		var body []byte
		return pool.QueryRow(ctx, `SELECT result FROM nolock_idempotency WHERE scope = $1 AND key = $2`,
			"bench", fmt.Sprint("old-", seq.Add(1)%replayKeys)).Scan(&body)
	}
	readRecord := func(ctx context.Context, c int) error {
		var fp, body []byte
		var terminal, expired bool
		var created, expires time.Time
		return pool.QueryRow(ctx, `SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now() FROM nolock_idempotency WHERE scope = $1 AND key = $2`,
			"bench", fmt.Sprint("old-", seq.Add(1)%replayKeys)).Scan(&fp, &terminal, &body, &created, &expires, &expired)
	}
	replay := func(ctx context.Context, c int) error {
		res, err := store.Do(ctx, "bench", fmt.Sprint("old-", seq.Add(1)%replayKeys), nil, func(context.Context, pgx.Tx) ([]byte, error) {
			return nil, fmt.Errorf("replay ran fn")
		})
		if err == nil && !res.Replayed {
			err = fmt.Errorf("not a replay")
		}
		return err
	}
	execReplay := func(ctx context.Context, c int) error {
		res, err := store.Exec(ctx, "bench", fmt.Sprint("old-", seq.Add(1)%replayKeys), nil, debitReturning, wallet(c))
		if err == nil && !res.Replayed {
			err = fmt.Errorf("not a replay")
		}
		return err
	}
	// execKeyed is the exec scenario through s, with keys from key.
	execKeyed := func(s *idempotency.Store, key func() string) op {
		return func(ctx context.Context, c int) error {
			res, err := s.Exec(ctx, "bench", key(), nil, debitReturning, wallet(c))
			if err == nil && res.Terminal {
				err = fmt.Errorf("not debited")
			}
			return err
		}
	}
	// ledgered is the ledger scenario with payment keys from key.
	ledgered := func(key func() string) func(ctx context.Context, c int) error {
		return func(ctx context.Context, c int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if err := debited(tx, ctx, c); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 1) ON CONFLICT DO NOTHING`, key())
				return err
			})
		}
	}
	v7 := func() string { return uuid.Must(uuid.NewV7()).String() }
	// begun begins a transaction on conn and reads whether key has a
	// record, in one round trip: the least a plan must do before it may
	// run the effect without ever running it on a replay.
	begun := func(ctx context.Context, conn *pgx.Conn, key string) error {
		var seen bool
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT EXISTS (SELECT FROM nolock_idempotency WHERE scope = 'bench' AND key = $1)`, key).QueryRow(func(r pgx.Row) error { return r.Scan(&seen) })
		if err := conn.SendBatch(ctx, b).Close(); err != nil || !seen {
			return err
		}
		return fmt.Errorf("key %s has a record", key)
	}
	// locked is begun with the key's lock tried first, as a claim does.
	locked := func(ctx context.Context, conn *pgx.Conn, key string) error {
		var free, seen bool
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_try_advisory_xact_lock(hashtextextended('bench' || $1, 0))`, key).QueryRow(func(r pgx.Row) error { return r.Scan(&free) })
		b.Queue(`SELECT EXISTS (SELECT FROM nolock_idempotency WHERE scope = 'bench' AND key = $1)`, key).QueryRow(func(r pgx.Row) error { return r.Scan(&seen) })
		if err := conn.SendBatch(ctx, b).Close(); err != nil || free && !seen {
			return err
		}
		return fmt.Errorf("key %s: locked %v, has a record %v", key, !free, seen)
	}
	// committed sends stmts, each of which must change one row, and
	// COMMIT, in one round trip.
	type batched struct {
		sql  string
		args []any
	}
	committed := func(ctx context.Context, conn *pgx.Conn, stmts ...batched) error {
		b := &pgx.Batch{}
		for _, st := range stmts {
			b.Queue(st.sql, st.args...).Exec(func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() != 1 {
					return fmt.Errorf("%d rows, want 1: %s", tag.RowsAffected(), st.sql)
				}
				return nil
			})
		}
		b.Queue(`COMMIT`)
		return conn.SendBatch(ctx, b).Close()
	}
	const insertRecord = `INSERT INTO nolock_idempotency (scope, key, fingerprint, result, expires_at) VALUES ('bench', $1, '', 'paid', now() + interval '1 day')`
	// doBound is a first run of Do's least plan: begin (begun, or locked),
	// the debit, the record inserted with COMMIT.
	doBound := func(prefix string, begin func(context.Context, *pgx.Conn, string) error) op {
		return func(ctx context.Context, c int) error {
			key := next(prefix)
			return onConn(ctx, pool, func(conn *pgx.Conn) error {
				if err := begin(ctx, conn, key); err != nil {
					return err
				}
				tag, err := conn.Exec(ctx, debit, wallet(c))
				if err == nil && tag.RowsAffected() != 1 {
					err = fmt.Errorf("not debited")
				}
				if err != nil {
					return err
				}
				return committed(ctx, conn, batched{insertRecord, []any{key}})
			})
		}
	}
	boundDo, boundDoLock := doBound("fd", begun), doBound("fl", locked)
	// boundExec is the least a quiet plan without a function does: the
	// read with BEGIN, then the statement and the record's insert with
	// COMMIT (the statement may run only once the read's answer is back).
	boundExec := func(ctx context.Context, c int) error {
		key := next("fe")
		return onConn(ctx, pool, func(conn *pgx.Conn) error {
			if err := begun(ctx, conn, key); err != nil {
				return err
			}
			return committed(ctx, conn, batched{debit, []any{wallet(c)}}, batched{insertRecord, []any{key}})
		})
	}
	// boundExecRows is boundExec with the key's lock, and the statement's
	// rows stored in the record it inserts and returned to the caller, as
	// Exec's Result.Body returns them.
	boundExecRows := func(ctx context.Context, c int) error {
		key := next("fr")
		return onConn(ctx, pool, func(conn *pgx.Conn) error {
			if err := locked(ctx, conn, key); err != nil {
				return err
			}
			var rows []byte
			b := &pgx.Batch{}
			b.Queue(`WITH e AS (`+debitReturning+`)
INSERT INTO nolock_idempotency (scope, key, fingerprint, result, expires_at)
SELECT 'bench', $2, '', convert_to(json_agg(e)::text, 'UTF8'), now() + interval '1 day' FROM e
RETURNING result`, wallet(c), key).QueryRow(func(r pgx.Row) error { return r.Scan(&rows) })
			b.Queue(`COMMIT`)
			return conn.SendBatch(ctx, b).Close()
		})
	}
	scenarios := []struct {
		name         string
		op, baseline op
	}{
		{"bare", bare, nil},
		{"ledger", ledgered(func() string { return next("l") }), bare},
		{"ledger-v7", ledgered(v7), ledgered(uuid.NewString)},
		{"forupdate", func(ctx context.Context, c int) error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var n int64
				if err := tx.QueryRow(ctx, `SELECT balance FROM wallets WHERE account = $1 FOR UPDATE`, wallet(c)).Scan(&n); err != nil {
					return err
				}
				return debited(tx, ctx, c)
			})
		}, bare},
		{"advisory", func(ctx context.Context, c int) error {
			key := next("a")
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, key); err != nil {
					return err
				}
				var seen bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM ledger WHERE payment = $1)`, key).Scan(&seen); err != nil || seen {
					return err
				}
				if err := debited(tx, ctx, c); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, 1)`, key)
				return err
			})
		}, bare},
		{"do", func(ctx context.Context, c int) error {
			_, err := store.Do(ctx, "bench", next("k"), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
				return []byte("paid"), debited(tx, ctx, c)
			})
			return err
		}, bare},
		{"exec", execKeyed(store, func() string { return next("e") }), bare},
		{"stmt", stmt, bare},
		{"exec-stmt", func(ctx context.Context, c int) error {
			_, err := store.Exec(ctx, "bench", next("s"), nil, debitReturning, wallet(c))
			return err
		}, stmt},
		{"read", read, nil},
		{"replay", replay, read},
		{"replay-claim", func(ctx context.Context, c int) error {
			store.PinDoPlan(false)
			return replay(ctx, c)
		}, read},
		{"exec-replay", execReplay, read},
		{"read-record", readRecord, read},
		{"exec-replay-record", execReplay, readRecord},
		{"exec-v7", execKeyed(store, v7), execKeyed(store, uuid.NewString)},
		{"exec-replay-claim", func(ctx context.Context, c int) error {
			store.PinPlan("claim")
			return execReplay(ctx, c)
		}, read},
		{"bound-do", boundDo, bare},
		{"bound-exec", boundExec, bare},
		{"bound-do-lock", boundDoLock, boundDo},
		{"bound-exec-rows", boundExecRows, boundExec},
	}
	// bounds holds, per scenario, the least any plan with its guarantees
	// does (x-bound).
	bounds := map[string]op{"do": boundDoLock, "exec": boundExecRows, "replay": readRecord, "exec-replay": readRecord}
	for _, sc := range scenarios {
		if only != nil && !slices.Contains(only, sc.name) {
			continue
		}
		for _, clients := range clientCounts {
			b.Run(fmt.Sprintf("%s/clients=%d", sc.name, clients), func(b *testing.B) {
				if counts == nil {
					runAgainst(b, clients, sc.op, sc.baseline, bounds[sc.name])
					return
				}
				errors, rollbacks := counts()
				// counts ended every session: open the clients' connections
				// again (and prepare their statements) before measuring, or
				// the first round, the baseline's, pays for it.
				ops := 4 * clients
				for _, f := range []op{sc.baseline, bounds[sc.name], sc.op} {
					if f != nil {
						testenv.Rounds(b, clients, 4*clients, 1, f)
					}
				}
				ops += runAgainst(b, clients, sc.op, sc.baseline, bounds[sc.name])
				errorsAfter, rollbacksAfter := counts()
				b.ReportMetric(float64(errorsAfter-errors)/float64(ops), "errors/op")
				b.ReportMetric(float64(rollbacksAfter-rollbacks)/float64(ops), "rollbacks/op")
			})
		}
	}
}

// onConn runs fn on a connection of pool. fn ends its transaction; if fn
// fails, a ROLLBACK follows (a no-op warning if fn's batch had already
// committed, and pgxpool closes a connection left in a transaction).
func onConn(ctx context.Context, pool *pgxpool.Pool, fn func(*pgx.Conn) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if err := fn(conn.Conn()); err != nil {
		_, rbErr := conn.Exec(ctx, `ROLLBACK`)
		return errors.Join(err, rbErr)
	}
	return nil
}

// runAgainst runs b.N operations of op over clients goroutines, reports
// units/s, and returns how many of op it ran. With a baseline, it runs as
// many of the baseline too, in rounds (testenv.Rounds), and reports
// x-baseline: the median over the rounds of op's rate over the
// baseline's; with a bound too, as many of the bound in the same rounds,
// and x-bound: the same of op's rate over the bound's.
func runAgainst(b *testing.B, clients int, op, baseline, bound func(ctx context.Context, client int) error) int {
	ops := []func(context.Context, int) error{op}
	for _, f := range []func(context.Context, int) error{baseline, bound} {
		if f != nil {
			ops = append(ops, f)
		}
	}
	// Every order of the ops, one to four times, in rounds of at least
	// eight operations a client where b.N allows.
	orders := []int{1, 1, 2, 6}[len(ops)]
	rounds := orders * min(max(b.N/(8*clients*orders), 1), 4)
	took := testenv.Rounds(b, clients, b.N, rounds, ops...)
	b.ReportMetric(testenv.RoundsRate(took, b.N, 0), "units/s")
	if baseline != nil {
		b.ReportMetric(testenv.RoundsRatio(took, 0, 1), "x-baseline")
	}
	if bound != nil {
		b.ReportMetric(testenv.RoundsRatio(took, 0, len(ops)-1), "x-bound")
	}
	return max(b.N/rounds, 1) * rounds
}
