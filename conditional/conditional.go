package conditional

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

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

var (
	// ErrSoldOut means the stock cannot cover the request: nothing was taken.
	ErrSoldOut = errors.New("conditional: sold out")
	// ErrInsufficient means the balance cannot cover the debit: nothing was
	// taken.
	ErrInsufficient = errors.New("conditional: insufficient balance")
	// ErrUnknownKey means no row exists for the key: nothing was changed.
	ErrUnknownKey = errors.New("conditional: unknown key")
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent to the database.
	ErrInvalid = errors.New("conditional: invalid argument")
	// ErrAmbiguousCommit means the connection failed after the statement was
	// sent, so it may or may not have committed. Read the state before
	// retrying a request that is not idempotent.
	ErrAmbiguousCommit = errors.New("conditional: commit outcome unknown")
	// ErrClosed means the Stock was closed before the request was sent.
	ErrClosed = errors.New("conditional: closed")
	// ErrHeld means another holder's hold on the resource has not expired
	// by the database's clock: nothing was changed.
	ErrHeld = errors.New("conditional: held by another holder")
	// ErrConfirmed means the resource's hold was confirmed, by this holder or
	// another; a confirmed resource is never held again: nothing was changed.
	ErrConfirmed = errors.New("conditional: already confirmed")
	// ErrNotHolder means the caller does not hold the resource (any more):
	// it is free, held by another, confirmed by another, or, for Confirm,
	// the caller's hold expired. Nothing was changed.
	ErrNotHolder = errors.New("conditional: not the holder")
	// ErrFenced means the row carries a newer fencing token than the
	// writer's: a newer holder exists, and nothing was written.
	ErrFenced = errors.New("conditional: fenced by a newer token")
)

// invalid returns an ErrInvalid that names what is wrong.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// validArg checks a key-like argument (a key, resource or holder name): it
// must be non-empty valid UTF-8 of at most MaxKeyLen bytes without NUL. The
// error names the argument.
func validArg(name, v string) error {
	switch {
	case v == "":
		return invalid("%s is empty", name)
	case len(v) > MaxKeyLen:
		return invalid("%s is %d bytes, more than %d", name, len(v), MaxKeyLen)
	case strings.IndexByte(v, 0) >= 0:
		return invalid("%s contains a NUL byte", name)
	case !utf8.ValidString(v):
		// PostgreSQL refuses it only after the round trip, and DynamoDB's
		// JSON encoder turns every invalid byte into U+FFFD, so two
		// different names would address one item.
		return invalid("%s is not valid UTF-8", name)
	}
	return nil
}

// checkCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return nil
}

// unsent returns ctx's error, naming op, if ctx is already done, and an
// ErrInvalid if ctx is nil. Every write checks it before its first I/O, so
// a caller whose ctx ended before the call is told nothing was sent, never
// ErrAmbiguousCommit.
func unsent(ctx context.Context, op string) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("conditional: %s: nothing sent: %w", op, err)
	}
	return nil
}

// MaxKeyLen bounds a key's length in bytes: keys live in a primary-key index.
const MaxKeyLen = 512

// classify turns a failed statement's error into what the caller may
// conclude: ErrAmbiguousCommit when the statement may have committed before
// the connection failed (see pgerr.Ambiguous), otherwise the error as is.
func classify(err error) error {
	if pgerr.Ambiguous(err) {
		return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
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
