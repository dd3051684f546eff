package dynamoidempotency

import "github.com/nolock/nolock/internal/idemrecord"

// The errors of this package. Package idempotency returns the same values,
// so errors.Is matches them whichever store returned them; each comment
// says what the error means.
var (
	ErrMismatch        = idemrecord.ErrMismatch        // key reused with another fingerprint; a *MismatchError
	ErrInProgress      = idemrecord.ErrInProgress      // concurrent duplicates kept meeting until the wait ran out
	ErrAmbiguousCommit = idemrecord.ErrAmbiguousCommit // sent, then the reply was lost: retry with the same key
	ErrInvalid         = idemrecord.ErrInvalid         // bad input, named in the text; nothing sent
	ErrNotFound        = idemrecord.ErrNotFound        // no live record for the key
)

// Limits on the arguments of Do, checked before any I/O.
const (
	MaxKeyLen         = idemrecord.MaxKeyLen         // bytes of a key (255)
	MaxScopeLen       = idemrecord.MaxScopeLen       // bytes of a scope (255)
	MaxFingerprintLen = idemrecord.MaxFingerprintLen // bytes of a fingerprint (64)
)

// Terminal marks the error a function returns as a terminal outcome,
// stored and replayed like a success.
func Terminal(err error) error { return idemrecord.Terminal(err) }

// Fingerprint returns the SHA-256 of parts, each prefixed with its length.
func Fingerprint(parts ...[]byte) []byte { return idemrecord.Fingerprint(parts...) }

// ValidKey reports whether Do would accept scope and key, without I/O.
func ValidKey(scope, key string) error { return idemrecord.ValidKey(scope, key) }
