package idempotency

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
)

// Exec is Do for an effect that is one SQL statement: an INSERT, UPDATE or
// DELETE with a RETURNING clause (or a SELECT), with its arguments. Exec
// claims the key as Do does (BEGIN and the claim in one round trip; on a
// Store made on a pgx.Tx, in a savepoint of it: see DB), then
// sends the statement, wrapped so that it also inserts the key's record
// holding its RETURNING rows (claimedSQL), with COMMIT: two round trips, as a
// bare transaction of the statement costs. It creates nothing on the
// server: the Store's table (CreateSchema) is all it needs. Once most
// recent calls were replays, Exec reads the record first, as Do does: a
// replay is then one read (docs/idempotency.md). No normal outcome raises
// an error on the server. An expired record counts as none. Cancelling
// ctx before the statement is sent rolls back; once it is sent with its
// COMMIT, Exec stops waiting and returns ErrAmbiguousCommit, and the
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
//     Exec or Do: Exec waits for it as Do does; if it commits, Exec
//     replays its record; if it rolls back, Exec runs.
//   - Every lock wait of the statement is bounded by WithWait (shortened
//     by ctx's deadline); when it runs out, Exec returns ErrInProgress
//     and nothing was written. A deadlock or serialization failure is
//     retried (WithAttempts).
//   - An error of the statement itself rolls everything back and is
//     returned, and so is an argument pgx cannot encode;
//     ErrAmbiguousCommit means the connection failed after the statement
//     and its COMMIT were sent: call Exec again with the same key.
//
// The first call with a statement text describes it (see statement) to
// check that args fill its parameters exactly.
// The statement runs inside a WITH clause, so it must not itself contain
// a data-modifying WITH, and $1 to $len(args) are its own parameters, so
// args must be positional (not pgx.NamedArgs or a query option). Use
// Do when the effect needs more than one statement or a decision in Go.
func (s *Store) Exec(ctx context.Context, scope, key string, fingerprint []byte, sql string, args ...any) (Result, error) {
	ctx, c := idemrecord.Start(s.obs, ctx, CallExec, key)
	defer c.Unwound()
	res, err := s.exec(ctx, scope, key, fingerprint, sql, args)
	s.observe(ctx, &c, key, res, err)
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
	return s.retried(ctx, &s.execPlan, scope, key, fingerprint, func(ctx context.Context, dup bool) (Result, error) {
		return s.once(ctx, &s.execPlan, dup, scope, key, fingerprint, true, runClaimed(stmt, args))
	})
}

// runClaimed is Exec's finisher: the statement and the record of its
// rows, one statement sent with COMMIT. A lock wait of the statement that
// ran out (lock_timeout, which the claim set to wait) is ErrInProgress;
// any other error of the statement rolls everything back and is returned.
func runClaimed(stmt wrapped, args []any) finisher {
	return func(ctx context.Context, s *Store, h *handle, tx pgx.Tx, rec *Record, takeover bool, wait time.Duration) error {
		sql := stmt.text
		if takeover {
			sql = stmt.takeover
		}
		b := &pgx.Batch{}
		b.Queue(sql, append(slices.Clip(args), rec.Scope, rec.Key, rec.Fingerprint, s.retention.Microseconds())...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&rec.Body)
			rec.Terminal = string(rec.Body) == "[]" // the statement returned no row
			return err
		})
		err := s.commit(ctx, h, tx, rec.Key, b)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // an ERROR: never ambiguous
			return errfmt.Errorf("%w: key %q: a lock the statement needed was not granted within %v: %w",
				ErrInProgress, rec.Key, wait, pgErr)
		}
		return err
	}
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
		err := s.onDB(ctx, func(ctx context.Context) error {
			_, err := s.pg.Exec(ctx, s.db, syncMarkSQL, s.over.Args()...)
			return err
		})
		if err != nil {
			return Result{}, errfmt.Errorf("idempotency: key %q: replay: waiting for its record to reach the synchronous standby: %w; nothing was run", f.Key, err)
		}
	}
	return replayOf(f.Record, fp)
}
