package idempotency

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/observe"
)

// Exec is Do for an effect that is one SQL statement: an INSERT, UPDATE or
// DELETE with a RETURNING clause (or a SELECT), with its arguments. By
// default Exec runs the statement through a function of its own on the
// server, made on the statement's first use (CREATE FUNCTION in the
// connection's current schema, once per statement text there; see
// execFuncSQL): one call takes the key, replays a live record or runs the
// statement and stores its record, in one round trip. Where the function
// cannot be made or trusted (no CREATE privilege there, transactions not
// Read Committed, a statement whose parameter types the server cannot
// infer, more than 95 parameters or 64 statement texts, a function of the
// same name that is not Exec's own), while another call of the Store is
// making it, and for a call with no bound on its lock waits (WithWait(0)
// and no deadline), Exec claims the key as Do does, then sends the
// statement with COMMIT: two round trips. Once most recent calls were
// replays, Exec reads the record first: a replay is then one read
// (docs/idempotency.md). No normal outcome raises an error on the server.
// An expired record counts as none. Cancelling ctx before the statement
// is sent rolls back; once it is sent with its COMMIT (or as the one
// call), Exec stops waiting and returns ErrAmbiguousCommit, and the
// statement runs to its end on the server's terms (as Do's commit does).
// The statement's RETURNING rows are stored as the result, a JSON array of
// objects (column name to value, as json_agg writes them); a statement
// that returns no row is stored as a terminal outcome (Terminal set, Body
// "[]"), so a debit refused for insufficient funds is replayed as refused.
//
//   - A live record with the same fingerprint is replayed (on a server
//     with a synchronous standby, once the standby holds it, as in Do),
//     one with another fingerprint is a *MismatchError; either way the
//     statement does not run.
//   - A concurrent request with the same key still in flight, through
//     Exec or Do: Exec waits for it on the key; if it commits, Exec
//     replays its record; if it rolls back, Exec runs. (With
//     WithSharedRoundTrip the statement runs its effect first, which rolls
//     back if the other commits; the server then logs the record's unique
//     violation.)
//   - Every lock wait, for the key or for the effect's rows, is bounded by
//     WithWait (shortened by ctx's deadline), each statement on its own;
//     when it runs out, Exec returns ErrInProgress and nothing was
//     written. A deadlock or serialization failure is retried
//     (WithAttempts). With WithSharedRoundTrip, Exec takes the effect's
//     locks before it meets the key's record, Do the key's first: the two
//     on one key with overlapping rows can deadlock, which the server
//     breaks after its deadlock_timeout.
//   - An error of the statement itself rolls everything back and is
//     returned (with WithSharedRoundTrip, unless it is a unique violation
//     on a table named as the Store's, which Exec takes for its own record
//     in the way), and so is an argument pgx cannot encode;
//     ErrAmbiguousCommit means the connection failed after the statement
//     and its COMMIT were sent: call Exec again with the same key.
//
// The statement runs inside a WITH clause, so it must not itself contain
// a data-modifying WITH, and $1 to $len(args) are its own parameters, so
// args must be positional (not pgx.NamedArgs or a query option). Use
// Do when the effect needs more than one statement or a decision in Go.
func (s *Store) Exec(ctx context.Context, scope, key string, fingerprint []byte, sql string, args ...any) (Result, error) {
	start := time.Now()
	res, err := s.exec(ctx, scope, key, fingerprint, sql, args)
	s.observe(ctx, key, start, res, err)
	return res, err
}

func (s *Store) exec(ctx context.Context, scope, key string, fingerprint []byte, sql string, args []any) (Result, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return Result{}, err
	}
	if err := idemrecord.ValidRequest(scope, key, fingerprint, false); err != nil {
		return Result{}, err
	}
	sql = strings.TrimRight(strings.TrimSpace(sql), "; \t\n")
	if sql == "" {
		return Result{}, idemrecord.Invalid("sql is empty")
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.NamedArgs, pgx.StrictNamedArgs, pgx.QueryExecMode, pgx.QueryRewriter:
			return Result{}, idemrecord.Invalid("args[0] is a %T: Exec numbers its own parameters after the statement's, so pass plain positional arguments", args[0])
		}
	}
	stmt, err := s.statement(ctx, sql, args)
	if err != nil {
		return Result{}, err
	}
	if fingerprint == nil {
		fingerprint = []byte{}
	}
	return s.retried(ctx, key, func(ctx context.Context) (Result, error) {
		switch {
		case s.shared:
			return s.execOnce(ctx, scope, key, fingerprint, stmt, args)
		case stmt.fn == nil || s.noFunc || s.waitFor(ctx) <= 0 || !s.funcUsable(ctx, stmt.fn):
			// (Without a bound on its lock waits, the function's wait for
			// the key could outlive ctx: ctx cannot cancel the one call.)
			return s.once(ctx, &s.execPlan, scope, key, fingerprint, runClaimed(stmt, args))
		}
		if res, done, err := s.replayFirst(ctx, &s.execPlan, scope, key, fingerprint); done {
			return res, err
		}
		return s.execViaFunc(ctx, stmt, scope, key, fingerprint, args)
	})
}

// runClaimed is Exec's finisher by default: the statement and the record
// of its rows, one statement sent with COMMIT. A lock wait of the
// statement that ran out is ErrInProgress; any other error of the
// statement rolls everything back and is returned.
func runClaimed(stmt wrapped, args []any) finisher {
	return func(ctx context.Context, s *Store, conn *pgx.Conn, tx pgx.Tx, release *func(), rec *Record) error {
		wait, bound := s.bound(ctx)
		b := &pgx.Batch{}
		b.Queue(stmt.text, append(slices.Clip(args), bound, rec.Scope, rec.Key)...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&rec.Body, &rec.Terminal)
		})
		err := s.commit(ctx, conn, tx, release, rec.Key, b)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // an ERROR: never ambiguous
			return s.execError(rec.Key, "one of the effect's rows", wait, pgErr)
		}
		return err
	}
}

// execOnce is one attempt of Exec with WithSharedRoundTrip: a read of the key's record, which
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
	if stmt.name != "" && !s.execPlan.readFirst() && !s.pg.Unnamed(s.db) {
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
	s.execPlan.observe(stored != nil)
	switch {
	case stored != nil && !stored.expired:
		return s.replayFound(ctx, *stored, fp)
	case stored != nil:
		// An expired record counts as absent: delete it (unless a takeover
		// by Do renewed it meanwhile, which the statement will then meet),
		// then run the statement. The delete's lock is the key's alone.
		dwait, bound := s.bound(ctx)
		tag, err := s.over.Exec(ctx, s.db, s.expireSQL, scope, key, bound)
		if err != nil {
			return Result{}, s.execError(key, "the key's record, held by a takeover in flight", dwait, err)
		}
		if tag.RowsAffected() == 1 {
			s.obs.Notify(ctx, observe.Event{Name: EventExpired, Key: key})
		}
		runAlone()
	}
	if err == nil {
		return Result{Record: rec}, nil
	}
	return s.execFailed(ctx, scope, key, fp, wait, err)
}

// execFailed answers an Exec statement that failed on its own, in its
// implicit transaction, having waited at most wait for a lock: a live
// record in its way now is the answer; otherwise the error says what it
// proves.
func (s *Store) execFailed(ctx context.Context, scope, key string, fp []byte, wait time.Duration, err error) (Result, error) {
	if pgerr.Ambiguous(err) {
		return Result{}, commitError(key, err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		// Nothing sent, or refused by pgx before sending (an argument it
		// could not encode).
		return Result{}, errfmt.Errorf("idempotency: exec %q: %w", key, err)
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
	return s.pg.Row(ctx, s.db, stmt, s.over.Args(args...)...).Scan(&rec.CreatedAt, &rec.ExpiresAt, &rec.Body, &rec.Terminal)
}

// execError classifies an error of one of Exec's statements, when no live
// record answers instead; locks says which locks it may have waited for.
func (s *Store) execError(key, locks string, wait time.Duration, err error) error {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return errfmt.Errorf("%w: key %q: a lock the statement needed (%s) was not granted within %v: %w",
			ErrInProgress, key, locks, wait, err)
	case errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.TableName == s.table:
		// The record the insert met has expired or was reaped since. (A
		// table of the same name in another schema would land here too:
		// its error is kept, and shows once the attempts run out.)
		return errfmt.Errorf("%w: %w", errVanished, err)
	}
	return errfmt.Errorf("idempotency: exec %q: %w", key, pgmode.Explain(err))
}

// replayFound answers from a live record as replayOf does. When its server
// has a synchronous standby, a replay (or a mismatch, which carries the
// record) answers only once the standby holds
// the WAL up to a commit of its own, the record's commit included (as Do's
// replay does): a record whose own wait for the standby was cancelled is
// never acknowledged before a failover could lose it. That commit is not
// cancelled by ctx; if ctx ends first, the error wraps
// pgerr.ErrStoppedWaiting and nothing was run.
func (s *Store) replayFound(ctx context.Context, f found, fp []byte) (Result, error) {
	if f.standby {
		if _, err := s.pg.Exec(ctx, s.db, syncMarkSQL, s.over.Args()...); err != nil {
			return Result{}, errfmt.Errorf("idempotency: key %q: replay: waiting for its record to reach the synchronous standby: %w; nothing was run", f.Key, err)
		}
	}
	return replayOf(f.Record, fp)
}
