package pgcas

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// Beginner is what Retry needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx
// (see Retry for what each gives), or a wrapper of yours, taken as is.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Retry is cas.Retry with each attempt a fresh transaction: it runs fn in
// a transaction and commits; when fn or the commit fails with a conflict
// (cas.ErrConflict, e.g. from Exec, or SQLSTATE 40001 or 40P01), it runs
// again in a new transaction, until it succeeds, fails otherwise, the
// attempts run out (the error says how many were made and wraps the last
// conflict) or ctx ends.
//
// fn must read what it decides on inside tx, so each attempt decides on a
// fresh read, and must have no side effects outside tx. A commit whose
// outcome is unknown is returned as cas.ErrAmbiguousCommit and not retried.
//
// ctx does not cancel a commit in flight: Retry, which has no owner to
// wait for it, waits for the commit itself, at most
// pgoutcome.CommitTimeout, and returns its outcome. An attempt that failed
// because the server connection did not keep pgx's named prepared
// statement (PgBouncer in transaction pooling, pgx's cache_statement
// mode) ran nothing: it is made again at once, its statements unnamed.
//
// db may be a pool or a *pgx.Conn (each attempt a transaction that
// commits on its own; on a *pgx.Conn, nothing else may use the connection
// while Retry runs), or your pgx.Tx: then each attempt is a savepoint of
// it, a conflict rolls back to the savepoint and tries again, and the
// effect is applied in your transaction: durable only once you commit it,
// taken back if you roll it back. Inside it Retry never reports
// cas.ErrAmbiguousCommit (your COMMIT decides), and a serialization
// failure under Repeatable Read or Serializable aborts your transaction:
// run it Read Committed, or roll back and run it again.
func Retry(ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) error, opts ...cas.Option) error {
	switch {
	case ctx == nil:
		return casstore.Invalid("ctx is nil")
	case pgarg.NilDB(db):
		return casstore.Invalid("db is nil")
	case fn == nil:
		return casstore.Invalid("fn is nil")
	}
	pg := pgerr.Inline() // the call's own: what it learns, its commits
	_, nested := db.(pgx.Tx)
	attempt := func(ctx context.Context) error {
		tx, err := pg.Begin(ctx, db)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			if !nested && pgerr.Ambiguous(err) {
				return errfmt.Errorf("%w: %w", cas.ErrAmbiguousCommit, err)
			}
			return err
		}
		return nil
	}
	return cas.Retry(ctx, func(ctx context.Context) error {
		err := attempt(ctx)
		if pgmode.MissingNamed(err) && pg.Unnamed(db) {
			err = attempt(ctx) // nothing ran; now unnamed (see pgmode)
		}
		return err
	}, opts...)
}

// Execer is what Exec needs: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn (see
// Exec), or a wrapper of yours, taken as is.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Exec runs a conditional statement, typically
//
//	UPDATE docs SET body = $1, version = version + 1 WHERE id = $2 AND version = $3
//
// and returns cas.ErrConflict when it changed no row: the version moved on (or
// the row is gone; read it again to tell). Use it inside Retry, on its
// tx. On a pgx.Tx the statement is applied in that transaction; on a pool
// or a *pgx.Conn it commits on its own, and Exec, which classifies
// nothing, returns pgx's error as is (see pgoutcome.Of for whether it may
// have committed).
func Exec(ctx context.Context, db Execer, sql string, args ...any) error {
	switch {
	case ctx == nil:
		return casstore.Invalid("ctx is nil")
	case pgarg.NilDB(db):
		return casstore.Invalid("db is nil")
	}
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return cas.ErrConflict
	}
	return nil
}
