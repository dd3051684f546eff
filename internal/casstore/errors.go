// Package casstore holds what package cas and its backends (packages
// pgcas and dynamocas) share below cas's public face: the sentinel errors,
// which cas exports as its own, and the checks every backend makes before
// it sends anything. It imports neither pgx nor the AWS SDK.
package casstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/nolock/nolock/internal/errfmt"
)

var (
	// ErrConflict means another writer changed the value since it was read:
	// nothing was written. Retry and Store retry it; the final error of an
	// exhausted retry wraps it.
	ErrConflict = errors.New("cas: version conflict")
	// ErrNotFound means no value is stored under the key.
	ErrNotFound = errors.New("cas: not found")
	// ErrExists means Create found a value already stored under the key.
	ErrExists = errors.New("cas: already exists")
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent.
	ErrInvalid = errors.New("cas: invalid argument")
	// ErrTooLarge means an encoded value exceeds the backend's limit.
	// Nothing was sent.
	ErrTooLarge = errors.New("cas: value too large")
	// ErrAmbiguousCommit means the write was sent and the connection then
	// failed, so it may or may not have been applied. It is not retried:
	// re-read (Get) and decide.
	ErrAmbiguousCommit = errors.New("cas: commit outcome unknown")
	// ErrClosed means the Store was closed before the update was sent.
	ErrClosed = errors.New("cas: closed")
)

// Invalid returns an ErrInvalid that names what is wrong.
func Invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// CheckCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func CheckCtx(ctx context.Context) error {
	if ctx == nil {
		return Invalid("ctx is nil")
	}
	return nil
}

// NotSent returns an error wrapping ctx.Err(), naming the write, if ctx has
// ended, and an ErrInvalid if ctx is nil: a backend checks it before
// sending, so that a write never sent is not reported as
// ErrAmbiguousCommit.
func NotSent(ctx context.Context, op, key string) error {
	if err := CheckCtx(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return errfmt.Errorf("cas: %s %q not sent: %w", op, key, err)
	}
	return nil
}

// Conflict reports whether err is worth a fresh attempt: a lost
// compare-and-set, or a PostgreSQL serialization failure (40001) or
// deadlock (40P01). PostgreSQL's errors are recognised by the SQLState
// method *pgconn.PgError has, so that this package needs no pgx.
func Conflict(err error) bool {
	if errors.Is(err, ErrConflict) {
		return true
	}
	var pgErr interface{ SQLState() string }
	if !errors.As(err, &pgErr) {
		return false
	}
	code := pgErr.SQLState()
	return code == "40001" || code == "40P01"
}

// LostRace reports a lost compare-and-set: the winner has committed, so a
// fresh read at once sees its write. A serialization failure or deadlock is
// not one: retried at once, it meets the transaction it lost to again.
func LostRace(err error) bool { return errors.Is(err, ErrConflict) }
