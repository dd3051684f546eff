// Package pgerr is the implementation behind package pgoutcome: what a
// failed PostgreSQL write proves (nothing sent, refused, or unknown), the
// serialization conflicts worth retrying, and running a commit so that the
// caller's cancellation cannot cut it short (Committer). It matches on
// types and SQLSTATEs, never on message text.
package pgerr

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/outcome"
)

// Outcome is what an error proves about a write that commits.
type Outcome = outcome.Outcome

// The outcomes, from the caller's side.
const (
	Committed = outcome.Committed
	NotSent   = outcome.NotSent
	Refused   = outcome.Refused
	Unknown   = outcome.Unknown
)

// ErrStoppedWaiting is part of the error Committer.Commit returns when the
// caller's context ended while the commit was in flight: its outcome is
// unknown.
var ErrStoppedWaiting = errors.New("stopped waiting for a commit in flight")

// notSentError marks a failure that happened before anything was written
// to a connection, such as a pool's Acquire.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// MarkUnsent wraps err, a failure before anything was written to the
// server (a pool's Acquire), so that Of reports NotSent.
func MarkUnsent(err error) error {
	if err == nil {
		return nil
	}
	return &notSentError{err}
}

// Of classifies err, returned by a statement that commits: a COMMIT, or a
// statement outside an explicit transaction. Judged by what may have
// reached the server:
//   - nil: Committed.
//   - NotSent: nothing reached the server (see Unsent).
//   - Unknown: the statement may have committed. The connection failed,
//     timed out or was cancelled after the statement was written; the server
//     or a pooler (PgBouncer) ended the session (FATAL, SQLSTATE class 08,
//     57P01-57P05); pgx reports the connection closed (it does so for a
//     reply lost after a COMMIT in the simple protocol, marked safe to
//     retry); Commit stopped waiting.
//   - Refused: the server answered with an ERROR, so the statement and the
//     transaction it would have committed rolled back; or pgx refused the
//     statement before sending it (an argument it cannot encode).
func Of(err error) Outcome {
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case err == nil:
		return Committed
	case errors.Is(err, ErrStoppedWaiting):
		return Unknown
	case Unsent(err):
		return NotSent
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return Refused // the transaction had failed: COMMIT rolled it back
	case errors.As(err, &pgErr):
		if endsSession(pgErr) {
			return Unknown
		}
		return Refused
	case errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &netErr) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.Timeout(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return Unknown
	}
	return Refused
}

// Unsent reports whether err proves that nothing reached the server: a
// connection that could not be made, a pool's Acquire that failed or timed
// out (marked by MarkUnsent, or a bare context.DeadlineExceeded, which
// pgconn never returns once it has written), a context that had ended
// before the call, a write that wrote no byte. pgx's SafeToRetry counts
// except for a closed connection, which pgx also reports for a reply lost
// after the statement was written.
func Unsent(err error) bool {
	var notSent *notSentError
	var connErr *pgconn.ConnectError
	switch {
	case err == nil || errors.Is(err, ErrStoppedWaiting) || errors.Is(err, pgconn.ErrConnClosed):
		return false
	case errors.As(err, &notSent) || errors.As(err, &connErr) || pgconn.SafeToRetry(err):
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err)
}

// endsSession reports a server (or pooler) error that ends the session
// rather than the statement: the statement may have committed before it.
func endsSession(e *pgconn.PgError) bool {
	switch cmp.Or(e.SeverityUnlocalized, e.Severity) {
	case "FATAL", "PANIC":
		return true
	}
	return strings.HasPrefix(e.Code, "08") || (strings.HasPrefix(e.Code, "57P0") && e.Code != "57P00")
}

// Ambiguous reports whether a failed statement that commits may
// nevertheless have committed: Of(err) == Unknown.
func Ambiguous(err error) bool { return Of(err) == Unknown }

// ServerTrouble reports a failure of the server or of the connection
// rather than of the statement: SQLSTATE classes 08 (connection
// exception), 53 (insufficient resources) and 57 (operator intervention,
// statement_timeout's 57014 included), and 25P03
// (idle_in_transaction_session_timeout).
func ServerTrouble(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	c := pgErr.Code
	return c == "25P03" || strings.HasPrefix(c, "08") || strings.HasPrefix(c, "53") || strings.HasPrefix(c, "57")
}

// Conflict reports whether err is a serialization failure (40001) or a
// deadlock (40P01): the transaction rolled back and may be retried afresh.
func Conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
