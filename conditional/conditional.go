package conditional

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// DB is what this package needs from pgx: a *pgxpool.Pool, a *pgx.Conn or
// a pgx.Tx satisfies it. It may grow in later versions. What each handle
// gives depends on the call:
//
//   - NewStock and NewAccounts take a pool only: a *pgx.Conn or a pgx.Tx
//     is refused with ErrInvalid, since the coalesced takes, debits and
//     credits of different keys run concurrently on goroutines of the
//     Stock, and such a handle runs one statement at a time. To take in
//     your transaction, or on your connection, pass it per call to
//     TakeIn, DebitIn or CreditIn.
//   - NewHolds takes any of the three. On a pool, a Holds is safe for
//     concurrent use. On a *pgx.Conn, use it from one goroutine at a time
//     (as the connection itself); each call waits for its own commit,
//     whatever its ctx does (at most pgoutcome.CommitTimeout), so nothing
//     runs on the connection once a call returned. On a pgx.Tx, use it
//     from one goroutine at a time too: it commits nothing itself, so its
//     holds, confirms and releases are applied in your transaction, and
//     commit or roll back with it; it never reports ErrAmbiguousCommit
//     (your COMMIT decides).
//   - TakeIn, DebitIn, CreditIn and Fenced.Update take the handle per
//     call, any of the three. In a pgx.Tx (the point of them) the effect
//     is applied in your transaction and commits or rolls back with it.
//     On a pool or a *pgx.Conn it commits on its own; on a *pgx.Conn the
//     call waits for its commit, whatever its ctx does (at most
//     pgoutcome.CommitTimeout), so nothing runs on the connection once it
//     returned.
//
// A wrapper of yours that a constructor cannot see through (to count
// statements or inject faults) is taken as is, as a pool: it must then be
// safe for concurrent use and commit each statement outside a transaction
// on its own.
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

// committerOn returns own, the Committer of the value called, or for a
// *pgx.Conn given per call an inline one: the commit then runs in the
// caller's goroutine whatever its ctx does (at most
// pgoutcome.CommitTimeout), so that nothing runs on the caller's
// connection once the call returned.
func committerOn(own *pgerr.Committer, db DB) *pgerr.Committer {
	if _, ok := db.(*pgx.Conn); ok {
		return pgerr.Inline()
	}
	return own
}
