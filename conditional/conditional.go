package conditional

import (
	"context"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// DB is what this package needs from pgx: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx all satisfy it. It may grow in later versions.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// classify turns a failed statement's error into what the caller may
// conclude: ErrAmbiguousCommit when the statement may have committed before
// the connection failed (see pgerr.Ambiguous), otherwise the error as is.
func classify(err error) error {
	if pgerr.Ambiguous(err) {
		return errfmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
	}
	return pgmode.Explain(err)
}

// classifyOn is classify for a statement run on db. Inside a caller's
// transaction nothing commits until the caller does, so a failed statement
// there is never ErrAmbiguousCommit.
func classifyOn(db DB, err error) error {
	if _, ok := db.(pgx.Tx); ok {
		return pgmode.Explain(err)
	}
	return classify(err)
}
