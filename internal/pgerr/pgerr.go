// Package pgerr classifies PostgreSQL errors the way nolock's packages need:
// may the statement have committed, and is it a serialization conflict worth
// retrying. It matches on types and SQLSTATEs, never on message text.
package pgerr

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Ambiguous reports whether a failed statement may nevertheless have
// committed: it was sent and the connection then failed or timed out before
// the outcome came back. It is false when nothing was sent (NotSent), when
// the server reported the failure (a *pgconn.PgError: the statement rolled
// back), and for local failures before sending (an argument that would not
// encode).
func Ambiguous(err error) bool {
	var pgErr *pgconn.PgError
	var netErr net.Error
	switch {
	case err == nil || NotSent(err) || errors.As(err, &pgErr):
		return false
	case errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.Timeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return false
}

// NotSent reports whether err says the statement never reached the
// server: pgx knows nothing was sent (pgconn.SafeToRetry), or no
// connection could be made (a *pgconn.ConnectError, from a pool's Acquire
// while the server is down or restarting), which pgx does not mark so.
func NotSent(err error) bool {
	var connErr *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &connErr)
}

// Conflict reports whether err is a serialization failure (40001) or a
// deadlock (40P01): the transaction rolled back and may be retried afresh.
func Conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
