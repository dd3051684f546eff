package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// execSQL wraps the caller's statement (%[1]s) so that its effect and the
// key's record are written by one statement, in one implicit transaction.
// Parameters $%[2]d to $%[6]d follow the caller's own.
//
//   - nolock_bound runs first (the effect is pulled only through a LATERAL
//     join on it, and a MATERIALIZED CTE is not folded into its user): it
//     bounds every lock wait of the statement by lock_timeout ($%[2]d), for
//     this implicit transaction only. Not just the key's: a duplicate of a
//     request in flight usually waits first for the effect's rows, which
//     that request holds, so a bound on the key's wait alone would bound
//     nothing (TestExecWaitsForInFlightDuplicate).
//   - nolock_effect is the caller's statement; its RETURNING rows become
//     the record's result (a JSON array; no row at all is stored as a
//     terminal outcome, such as a debit refused for insufficient funds).
//   - The INSERT writes the record. A record for the key, committed since
//     Exec read it or by a concurrent duplicate this insert waited for on
//     the key's index entry, makes it fail with a unique violation, and the
//     effect rolls back with it: no effect ever commits without its key.
//     That error is the only guard, and it costs nothing until it fires:
//     an ON CONFLICT clause and a check of its outcome in the same
//     statement made every first run about 10 % slower (pgbench).
const execSQL = `WITH nolock_bound AS MATERIALIZED (
  SELECT set_config('lock_timeout', coalesce($%[2]d, current_setting('lock_timeout')), true) AS lock_timeout),
nolock_effect AS (%[1]s
)
INSERT INTO {{table}} (scope, key, fingerprint, result, terminal, expires_at)
SELECT $%[3]d, $%[4]d, $%[5]d, convert_to(coalesce(r.rows, '[]'), 'UTF8'), r.rows IS NULL,
       now() + $%[6]d::bigint * interval '1 microsecond'
FROM nolock_bound b, LATERAL (SELECT json_agg(e)::text AS rows FROM nolock_effect e WHERE b.lock_timeout IS NOT NULL) r
RETURNING created_at, expires_at, result, terminal`

// gateSQL is Exec's read when it shares a round trip with the statement:
// the key's record, as readSQL returns it, and then, if there was one, an
// error, so that the server skips the statement sent after it (a pipeline
// skips everything after an error until its Sync). The error is a cast of
// the CTE's text column to boolean (the planner cannot see through a
// MATERIALIZED CTE, so it never folds the cast into an error at planning
// time). The server logs that error, gateMarker, once per call that finds
// a record while sharing (a replay, a mismatch or an expired record).
const gateSQL = `WITH r AS MATERIALIZED (
  SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now() AS expired,
         current_setting('synchronous_standby_names') <> '' AS standby, '` + gateMarker + `'::text AS gate
  FROM {{table}} WHERE scope = $1 AND key = $2)
SELECT fingerprint, terminal, result, created_at, expires_at, expired, standby FROM r
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM r WHERE r.gate::boolean`

const gateMarker = "nolock idempotency: this key has a record, so the statement sent with this read is skipped (a replay, not a failure)"

// Exec is Do for an effect that is one SQL statement: an INSERT, UPDATE or
// DELETE with a RETURNING clause (or a SELECT), with its arguments. Exec
// reads the key's record, and if there is none, writes the effect and the
// record in one statement, one implicit transaction: no BEGIN, no COMMIT.
// The read and the statement usually share one round trip (see plan and
// docs/idempotency.md). An expired record counts as none: Exec deletes
// it, one more statement, and runs the statement.
// The statement's RETURNING rows are stored as the result, a JSON array of
// objects (column name to value, as json_agg writes them); a statement
// that returns no row is stored as a terminal outcome (Terminal set, Body
// "[]"), so a debit refused for insufficient funds is replayed as refused.
//
//   - A live record with the same fingerprint is replayed (on a server
//     with a synchronous standby, once the standby holds it, as in Do),
//     one with another fingerprint is a *MismatchError; either way the
//     statement does not run.
//   - A concurrent request with the same key still in flight: the
//     statement runs its effect, then waits for the other on the key; if
//     the other commits, the effect rolls back and Exec replays the
//     other's record; if it rolls back, Exec's effect and record commit.
//   - Every lock wait of the statement, for the key or for the effect's
//     rows, is bounded by WithWait (shortened by ctx's deadline), and so
//     is the delete of an expired record, each statement on its own; when
//     it runs out, Exec returns ErrInProgress (the text says which locks
//     it may have been) and nothing was written. Exec takes the effect's
//     locks before the key's, Do the key's first: the two on one key with
//     overlapping rows can deadlock, which the server breaks after its
//     deadlock_timeout, and the loser's attempt is retried (WithAttempts).
//   - An error of the statement itself rolls everything back and is
//     returned (unless it is a unique violation on a table named as the
//     Store's, which Exec takes for its own record in the way), and so is
//     an argument pgx cannot encode; ErrAmbiguousCommit means the
//     connection failed after the statement was sent: call Exec again
//     with the same key.
//
// The statement runs inside a WITH clause, so it must not itself contain
// a data-modifying WITH, and $1 to $len(args) are its own parameters, so
// args must be positional (not pgx.NamedArgs or a query option). Use
// Do when the effect needs more than one statement or a decision in Go.
func (s *Store) Exec(ctx context.Context, scope, key string, fingerprint []byte, sql string, args ...any) (Result, error) {
	if err := checkCtx(ctx); err != nil {
		return Result{}, err
	}
	if err := validRequest(scope, key, fingerprint, false); err != nil {
		return Result{}, err
	}
	sql = strings.TrimRight(strings.TrimSpace(sql), "; \t\n")
	if sql == "" {
		return Result{}, invalid("sql is empty")
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.NamedArgs, pgx.StrictNamedArgs, pgx.QueryExecMode, pgx.QueryRewriter:
			return Result{}, invalid("args[0] is a %T: Exec numbers its own parameters after the statement's, so pass plain positional arguments", args[0])
		}
	}
	stmt, err := s.statement(ctx, sql, args)
	if err != nil {
		return Result{}, err
	}
	if fingerprint == nil {
		fingerprint = []byte{}
	}
	var res Result
	err = s.policy.Retry(ctx, func(ctx context.Context, _ int) error {
		var err error
		res, err = settled(ctx, func() (Result, error) {
			return s.execOnce(ctx, scope, key, fingerprint, stmt, args)
		})
		return err
	}, retryable, nil)
	var exhausted *backoff.ExhaustedError
	if errors.As(err, &exhausted) {
		return Result{}, fmt.Errorf("idempotency: key %q: %w", key, err)
	}
	return res, err
}

// statement returns sql wrapped in execSQL, after refusing it unless it
// uses exactly len(args) parameters: Exec's own follow the caller's, so a
// missing argument would silently bind one of them (a debit "WHERE
// account = $1" matching nothing, stored as refused). The first call with
// a statement text describes it (a few round trips, nothing run), one text
// at a time, and the result is kept for the Store's life, for its first
// maxDescribed texts. No statement runs unchecked: one the server cannot
// describe is refused, or its call fails having run nothing (see
// describe).
//
// It also decides whether the statement may share a round trip with the
// read (see readAndRun): only through a pool that prepares statements
// anyway, as every connection keeps one for it; only for the first
// maxShared texts the Store meets; and only where transactions are Read
// Committed by default (as the Store's first connection says), since
// under Serializable the read's predicate locks, in the statement's
// transaction, would fail concurrent first runs of neighbouring keys
// (40001).
func (s *Store) statement(ctx context.Context, sql string, args []any) (wrapped, error) {
	n := len(args)
	v, ok := s.statements.Load(sql)
	if !ok {
		select {
		case s.describing <- struct{}{}:
			defer func() { <-s.describing }()
		case <-ctx.Done():
			return wrapped{}, fmt.Errorf("idempotency: describe the statement: %w", context.Cause(ctx))
		}
		if v, ok = s.statements.Load(sql); !ok {
			w, keep, err := s.describe(ctx, sql, args)
			if err != nil {
				return wrapped{}, err
			}
			if v = w; keep && s.describedTexts < maxDescribed {
				s.describedTexts++
				s.statements.Store(sql, w)
			}
		}
	}
	w := v.(wrapped)
	switch {
	case w.params != n:
		return wrapped{}, invalid("sql uses %d parameters and %d args were given", w.params, n)
	}
	return w, nil
}

// describe describes sql, called with args, for statement, which holds
// s.describing, and says whether to keep the outcome. The description is
// the unnamed statement's, made and read in one round trip, so a
// transaction pooler cannot split it.
//
// Where the server cannot infer a parameter's type from sql alone
// (42P18: only the wrapper, or the value sent through a simple-protocol
// pool, implies it), sql is described again with the types pgx gives
// args' Go values: the number of parameters does not depend on them, but
// is then at least len(args), so a missing argument is caught (it would
// bind one of Exec's own parameters) and one too many is left to the
// statement's run, which refuses an argument no parameter takes. If the
// server still cannot describe it, the call is refused (ErrInvalid)
// before anything runs: a cast ($1::text) makes it describable.
//
// Any other refusal (a table not created yet, a syntax error) fails the
// call with the server's error, having run nothing, and so does a
// describe without the server's answer (a connection lost); sql is
// described again on the next call.
func (s *Store) describe(ctx context.Context, sql string, args []any) (w wrapped, keep bool, err error) {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return wrapped{}, false, fmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
	}
	defer c.Release()
	conn := c.Conn()
	d, err := conn.Prepare(ctx, "", sql)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P18" && !pgerr.Ambiguous(err) {
		oids := make([]uint32, len(args))
		for i, a := range args {
			if t, ok := conn.TypeMap().TypeForValue(a); ok && a != nil {
				oids[i] = t.OID
			}
		}
		if d, err = conn.PgConn().Prepare(ctx, "", sql, oids); errors.As(err, &pgErr) && !pgerr.Ambiguous(err) {
			return wrapped{}, false, invalid("Exec cannot check sql's parameters against its %d args: the server cannot tell their types (%v); cast them, as in $1::text", len(args), err)
		}
	}
	if err != nil {
		if !errors.As(err, &pgErr) || pgerr.Ambiguous(err) {
			err = pgerr.MarkUnsent(err)
		}
		return wrapped{}, false, fmt.Errorf("idempotency: describe the statement: %w", err)
	}
	n := len(d.ParamOIDs)
	w = wrapped{text: s.wrap(sql, n), params: n}
	if s.isolation == "" {
		_ = conn.QueryRow(ctx, `SELECT current_setting('default_transaction_isolation')`, s.over...).Scan(&s.isolation)
	}
	if s.sharedTexts < maxShared && s.isolation == "read committed" &&
		conn.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		s.sharedTexts++
		w.name = preparedName(w.text)
	}
	return w, true, nil
}

// wrapped is the caller's statement in execSQL, as Exec sends it.
type wrapped struct {
	text   string
	params int    // the caller's statement's parameters
	name   string // its prepared statement's, when it may share the read's round trip
}

// maxShared bounds how many statement texts a Store prepares on each
// connection, and maxDescribed how many it remembers (against SQL built
// afresh for each call, which is then described on every call). The
// bounds are per Store.
const maxShared, maxDescribed = 64, 4096

// wrap returns sql, which uses n parameters, wrapped in execSQL.
func (s *Store) wrap(sql string, n int) string {
	return fmt.Sprintf(s.execSQL, sql, n+1, n+2, n+3, n+4, n+5)
}

// preparedName names readAndRun's prepared statement for sql. Not sql
// itself: pgx would then run sql through it everywhere on the connection,
// where nothing prepares it again after a DEALLOCATE ALL.
func preparedName(sql string) string {
	d := sha256.Sum256([]byte(sql))
	return "nolock_" + hex.EncodeToString(d[:20])
}

// execOnce is one attempt of Exec: a read of the key's record, which
// answers a replay by itself, and only when there is none, the statement;
// both in one round trip when plan says so.
func (s *Store) execOnce(ctx context.Context, scope, key string, fp []byte, stmt wrapped, args []any) (Result, error) {
	rec := Record{Scope: scope, Key: key, Fingerprint: fp}
	var stored *found
	var wait time.Duration
	var err error
	runAlone := func() {
		var sargs []any
		wait, sargs = s.args(ctx, scope, key, fp, args)
		err = s.run(ctx, stmt.text, sargs, &rec)
	}
	if stmt.name != "" && s.plan.shared() {
		var sargs []any
		var sent bool
		wait, sargs = s.args(ctx, scope, key, fp, args)
		stored, sent, err = s.readAndRun(ctx, scope, key, stmt, sargs, &rec)
		if !sent || errors.Is(err, errVanished) {
			return Result{}, err
		}
	} else {
		var f found
		switch f, err = s.lookup(ctx, scope, key); {
		case err == nil:
			stored = &f
		case !errors.Is(err, ErrNotFound):
			return Result{}, err
		default:
			runAlone()
		}
	}
	s.plan.observe(stored != nil)
	switch {
	case stored != nil && !stored.expired:
		return s.replayFound(ctx, *stored, fp)
	case stored != nil:
		// An expired record counts as absent: delete it (unless a takeover
		// by Do renewed it meanwhile, which the statement will then meet),
		// then run the statement. The delete's lock is the key's alone.
		dwait, bound := s.bound(ctx)
		if _, err := s.db.Exec(ctx, s.expireSQL, s.over.Args(scope, key, bound)...); err != nil {
			return Result{}, s.execError(key, "the key's record, held by a takeover in flight", dwait, err)
		}
		runAlone()
	}
	if err == nil {
		return Result{Record: rec}, nil
	}
	if pgerr.Ambiguous(err) {
		return Result{}, commitError(key, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		// Nothing sent, or refused by pgx before sending (an argument it
		// could not encode).
		return Result{}, fmt.Errorf("idempotency: exec %q: %w", key, err)
	}
	// Rolled back. If a live record stands in the way now, it is the answer.
	if f, rerr := s.lookup(ctx, scope, key); rerr != nil && !errors.Is(rerr, ErrNotFound) {
		return Result{}, rerr
	} else if rerr == nil && !f.expired {
		return s.replayFound(ctx, f, fp)
	}
	return Result{}, s.execError(key, "the key's, held by a request in flight, or one of the effect's rows", wait, err)
}

// args returns the arguments of the wrapped statement: the caller's, then
// Exec's own; and the wait they bound the statement to.
func (s *Store) args(ctx context.Context, scope, key string, fp []byte, args []any) (time.Duration, []any) {
	wait, bound := s.bound(ctx)
	return wait, append(slices.Clip(args), bound, scope, key, fp, s.retention.Microseconds())
}

// run runs stmt, the caller's statement in execSQL, on its own, and scans
// the record it wrote into rec.
func (s *Store) run(ctx context.Context, stmt string, args []any, rec *Record) error {
	return pgerr.Row(ctx, s.db, stmt, s.over.Args(args...)...).Scan(&rec.CreatedAt, &rec.ExpiresAt, &rec.Body, &rec.Terminal)
}

// readAndRun sends gateSQL and stmt in one pipeline, one implicit
// transaction, and returns the key's record if there is one (the server
// then skipped stmt), or else stmt's outcome, its record scanned into rec.
// sent is false when the connection could not be had or a statement not
// prepared: then neither was run.
//
// Both are named prepared statements of the connection (prepared on its
// first use, two more round trips) rather than entries of pgx's statement
// cache, which drops every statement of a batch that failed: the gate's
// error is how a replay ends. When the server no longer has one (after
// DISCARD ALL or DEALLOCATE ALL, which leave pgx's list stale, or a change
// to the table's columns), both names are dropped and the attempt is made
// again.
func (s *Store) readAndRun(ctx context.Context, scope, key string, stmt wrapped, args []any, rec *Record) (stored *found, sent bool, err error) {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
	}
	conn := c.Conn()
	for _, q := range [][2]string{{s.gateName, s.gateSQL}, {stmt.name, stmt.text}} {
		if _, err := conn.Prepare(ctx, q[0], q[1]); err != nil {
			c.Release()
			return nil, false, fmt.Errorf("idempotency: exec %q: prepare: %w", key, pgmode.Explain(err))
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.gateName, scope, key)
	b.Queue(stmt.name, args...)
	// The statement commits on its own: it runs to its end on the
	// server's terms even if the caller stops waiting (see pgerr.Commit),
	// and the connection is released by whoever finishes it.
	var gs *found
	err = pgerr.Commit(ctx, func(ctx context.Context) error {
		defer c.Release()
		var err error
		gs, err = s.gateAndRun(ctx, conn, b, scope, key, stmt.name, rec)
		return err
	})
	if errors.Is(err, pgerr.ErrStoppedWaiting) {
		return nil, true, err // the pipeline still runs: leave its results
	}
	return gs, true, err
}

// gateAndRun sends readAndRun's pipeline on conn and reads its results.
func (s *Store) gateAndRun(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, scope, key, name string, rec *Record) (stored *found, err error) {
	br := conn.SendBatch(ctx, b)
	rows, _ := br.Query()
	for rows.Next() {
		f := found{Record: Record{Scope: scope, Key: key}}
		if err = f.scan(rows); err != nil {
			break
		}
		stored = &f
	}
	switch {
	case stored != nil:
		br.Close() // the gate's error: it skipped stmt
		return stored, nil
	case err == nil && rows.Err() != nil:
		err = rows.Err()
	case err == nil:
		err = br.QueryRow().Scan(&rec.CreatedAt, &rec.ExpiresAt, &rec.Body, &rec.Terminal)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return nil, s.unprepared(ctx, conn, name, err)
}

// unprepared returns err, or, when err says that one of readAndRun's
// prepared statements is gone (26000) or no longer fits the table (0A000
// from the server's revalidation of it, "cached plan must not change
// result type", which recurs until it is prepared again), drops both
// names and returns errVanished: make the attempt again.
func (s *Store) unprepared(ctx context.Context, conn *pgx.Conn, name string, err error) error {
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) ||
		pgErr.Code != "26000" && (pgErr.Code != "0A000" || pgErr.Routine != "RevalidateCachedQuery") {
		return err
	}
	for _, q := range []string{s.gateName, name} {
		if derr := conn.Deallocate(ctx, q); derr != nil {
			return err
		}
	}
	return fmt.Errorf("%w: %w", errVanished, err)
}

// plan chooses between Exec's two ways from the calls the Store has seen.
// Sharing one round trip costs a first run one round trip instead of two,
// and a replay the read plus a skipped statement (an aborted transaction,
// as much again as the read on a busy server); reading first costs a
// replay the read alone. Exec reads first once the calls that found a
// record outnumber those that did not, and shares again once the others
// have made up the difference (the count stops at ±planMemory, so a long
// past weighs no more than planMemory calls). The outcomes are the same
// either way; only the cost differs.
type plan struct {
	lean atomic.Int32 // +1 per call that found a record, -1 per call that did not, within ±planMemory
}

const planMemory = 64

func (p *plan) shared() bool { return p.lean.Load() <= 0 }

func (p *plan) observe(found bool) {
	for {
		old := p.lean.Load()
		v := old - 1
		if found {
			v = old + 1
		}
		if v < -planMemory || v > planMemory || p.lean.CompareAndSwap(old, v) {
			return
		}
	}
}

// execError classifies an error of one of Exec's statements, when no live
// record answers instead; locks says which locks it may have waited for.
func (s *Store) execError(key, locks string, wait time.Duration, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return fmt.Errorf("%w: key %q: a lock the statement needed (%s) was not granted within %v: %w",
			ErrInProgress, key, locks, wait, err)
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == s.table:
		// The record the insert met has expired or was reaped since. (A
		// table of the same name in another schema would land here too:
		// its error is kept, and shows once the attempts run out.)
		return fmt.Errorf("%w: %w", errVanished, err)
	}
	return fmt.Errorf("idempotency: exec %q: %w", key, pgmode.Explain(err))
}

// replayFound answers from a live record as replayOf does. When its server
// has a synchronous standby, a replay answers only once the standby holds
// the WAL up to a commit of its own, the record's commit included (as Do's
// replay does): a record whose own wait for the standby was cancelled is
// never acknowledged before a failover could lose it. That commit is not
// cancelled by ctx; if ctx ends first, the error wraps
// pgerr.ErrStoppedWaiting and nothing was run.
func (s *Store) replayFound(ctx context.Context, f found, fp []byte) (Result, error) {
	res, err := replayOf(f.Record, fp)
	if err != nil || !f.standby {
		return res, err
	}
	if _, err := pgerr.Exec(ctx, s.db, syncMarkSQL, s.over.Args()...); err != nil {
		return Result{}, fmt.Errorf("idempotency: key %q: replay: waiting for its record to reach the synchronous standby: %w; nothing was run", f.Key, err)
	}
	return res, nil
}
