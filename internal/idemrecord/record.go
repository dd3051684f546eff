// Package idemrecord holds what package idempotency and its DynamoDB twin,
// package dynamoidempotency, share: the record a key keeps, the result of
// Do, the sentinel errors, the argument limits and checks, and the
// settings both stores take. It imports neither pgx nor the AWS SDK, so
// each public package re-exports it without pulling in the other backend;
// the re-exported values are these very ones, so errors.Is, errors.As and
// type identity hold across backends.
package idemrecord

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
)

var (
	// ErrMismatch means the key was already used with a different request
	// fingerprint: nothing ran. The error is the package's *MismatchError carrying the
	// stored record. HTTP: 422.
	ErrMismatch = errors.New("idempotency: key reused with a different request")
	// ErrInProgress means another request with the same key was still
	// running when the wait bound (WithWait, or the context's deadline)
	// ran out: nothing ran and nothing was stored; retry later with the
	// same key. HTTP: 409.
	ErrInProgress = errors.New("idempotency: a request with this key is in progress")
	// ErrAmbiguousCommit means the connection failed after COMMIT was
	// sent, so the effect and its record may or may not have committed.
	// Retrying with the same key is safe: it replays the stored result if
	// the commit happened and runs the function if it did not.
	ErrAmbiguousCommit = errors.New("idempotency: commit outcome unknown")
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent to the database.
	ErrInvalid = errors.New("idempotency: invalid argument")
	// ErrNotFound means no live record exists for the key (it was never
	// stored, its transaction rolled back, or it expired).
	ErrNotFound = errors.New("idempotency: no record")
)

// Limits on the arguments of Do, checked before any I/O.
const (
	// MaxKeyLen bounds a key's length in bytes, as Stripe bounds its
	// Idempotency-Key header (255 characters).
	MaxKeyLen = 255
	// MaxScopeLen bounds a scope's length in bytes.
	MaxScopeLen = 255
	// MaxFingerprintLen bounds a fingerprint's length: a SHA-512 fits.
	MaxFingerprintLen = 64
)

// Terminal marks the error a function returns as a terminal outcome (for
// example insufficient funds): Do then commits the transaction with
// whatever the function wrote, stores the body the function returned with
// Record.Terminal set, and returns it with a nil error; a retry with the
// same key replays it instead of trying again. Encode in the body what the
// caller needs to know about the failure: the error itself is not stored.
// Any error not marked terminal rolls everything back and stores nothing.
func Terminal(err error) error { return &terminalError{err} }

type terminalError struct{ err error }

func (e *terminalError) Error() string {
	if e.err == nil {
		return "idempotency: terminal outcome"
	}
	return "idempotency: terminal outcome: " + e.err.Error()
}

func (e *terminalError) Unwrap() error { return e.err }

// IsTerminal reports whether err carries the Terminal mark.
func IsTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

// Fingerprint returns the SHA-256 of parts, each prefixed with its length
// so that ("ab", "c") and ("a", "bc") differ. Pass everything that makes
// two requests different (for HTTP: method, path and body; for a payment:
// payer, payee, amount, currency), so that a key reused for another request
// is refused with ErrMismatch instead of replaying the first one's result.
func Fingerprint(parts ...[]byte) []byte {
	h := sha256.New()
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

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

// ValidText checks a key or scope: at most max bytes of valid UTF-8 without
// NUL (PostgreSQL's text holds neither), and not empty unless allowEmpty.
func ValidText(name, v string, max int, allowEmpty bool) error {
	switch {
	case v == "" && !allowEmpty:
		return Invalid("%s is empty", name)
	case len(v) > max:
		return Invalid("%s is %d bytes, more than %d", name, len(v), max)
	case strings.IndexByte(v, 0) >= 0:
		return Invalid("%s contains a NUL byte", name)
	case !utf8.ValidString(v):
		return Invalid("%s is not valid UTF-8", name)
	}
	return nil
}

// ValidKey reports whether Do would accept scope and key: nil, or an
// ErrInvalid naming the one that is not. A key is 1 to MaxKeyLen bytes, a
// scope at most MaxScopeLen; both valid UTF-8 without NUL. It does no I/O.
func ValidKey(scope, key string) error {
	if err := ValidText("scope", scope, MaxScopeLen, true); err != nil {
		return err
	}
	return ValidText("key", key, MaxKeyLen, false)
}

// ValidRequest checks the arguments every backend's Do takes.
func ValidRequest(scope, key string, fingerprint []byte, fnIsNil bool) error {
	if err := ValidKey(scope, key); err != nil {
		return err
	}
	if len(fingerprint) > MaxFingerprintLen {
		return Invalid("fingerprint is %d bytes, more than %d", len(fingerprint), MaxFingerprintLen)
	}
	if fnIsNil {
		return Invalid("fn is nil")
	}
	return nil
}
