// Package condcore holds what package conditional and its DynamoDB twin,
// package dynamoconditional, share: the sentinel errors, HoldError's text and the
// checks every call makes before any I/O. It imports neither pgx nor the
// AWS SDK, so each public package re-exports it without pulling in the
// other backend; the re-exported values are these very ones, so errors.Is,
// errors.As and type identity hold across backends.
package condcore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
)

var (
	// ErrSoldOut means the stock cannot cover the request: nothing was taken.
	ErrSoldOut = errors.New("conditional: sold out")
	// ErrClosed means the Stock or Accounts was closed before the request
	// was sent: nothing was taken.
	ErrClosed = errors.New("conditional: closed")
	// ErrInsufficient means the balance cannot cover the debit: nothing was
	// taken.
	ErrInsufficient = errors.New("conditional: insufficient balance")
	// ErrNotFound means no row exists for the key: nothing was changed.
	ErrNotFound = errors.New("conditional: unknown key")
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent to the database.
	ErrInvalid = errors.New("conditional: invalid argument")
	// ErrAmbiguousCommit means the connection failed after the statement was
	// sent, so it may or may not have committed. Read the state before
	// retrying a request that is not idempotent.
	ErrAmbiguousCommit = errors.New("conditional: commit outcome unknown")
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

// MaxKeyLen bounds a key's length in bytes: keys live in a primary-key index.
const MaxKeyLen = 512

// Invalid returns an ErrInvalid that names what is wrong.
func Invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Options wraps an error of the constructors' options (a nil option, a
// setter given to a constructor it does not apply to) in ErrInvalid; nil
// stays nil.
func Options(err error) error {
	if err == nil {
		return nil
	}
	return errfmt.Errorf("%w: %w", ErrInvalid, err)
}

// ValidArg checks a key-like argument (a key, resource or holder name): it
// must be non-empty valid UTF-8 of at most MaxKeyLen bytes without NUL. The
// error names the argument.
func ValidArg(name, v string) error {
	switch {
	case v == "":
		return Invalid("%s is empty", name)
	case len(v) > MaxKeyLen:
		return Invalid("%s is %d bytes, more than %d", name, len(v), MaxKeyLen)
	case strings.IndexByte(v, 0) >= 0:
		return Invalid("%s contains a NUL byte", name)
	case !utf8.ValidString(v):
		// PostgreSQL refuses it only after the round trip, and DynamoDB's
		// JSON encoder turns every invalid byte into U+FFFD, so two
		// different names would address one item.
		return Invalid("%s is not valid UTF-8", name)
	}
	return nil
}

// ValidArgs checks each of vs as ValidArg does, naming a bad one
// "name[i]"; the name is formatted only for the error.
func ValidArgs(name string, vs []string) error {
	for i, v := range vs {
		if ValidArg(name, v) != nil {
			return ValidArg(fmt.Sprintf("%s[%d]", name, i), v)
		}
	}
	return nil
}

// CheckCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func CheckCtx(ctx context.Context) error {
	if ctx == nil {
		return Invalid("ctx is nil")
	}
	return nil
}

// Unsent returns ctx's error, naming op, if ctx is already done, and an
// ErrInvalid if ctx is nil. Every write checks it before its first I/O, so
// a caller whose ctx ended before the call is told nothing was sent, never
// ErrAmbiguousCommit.
func Unsent(ctx context.Context, op string) error {
	if err := CheckCtx(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return errfmt.Errorf("conditional: %s: nothing sent: %w", op, err)
	}
	return nil
}

// HoldMessage is a HoldError's text: one line, one package prefix.
func HoldMessage(resource string, err error) string {
	return fmt.Sprintf("conditional: hold %q: %s", resource, strings.TrimPrefix(err.Error(), "conditional: "))
}
