package cas

import (
	"fmt"

	"github.com/nolock/nolock/internal/casstore"
)

// The errors of this package, its Store and its backends (packages pgcas
// and dynamocas).
var (
	// ErrConflict means another writer changed the value since it was read:
	// nothing was written. Retry and Store retry it; the final error of an
	// exhausted retry wraps it.
	ErrConflict = casstore.ErrConflict
	// ErrNotFound means no value is stored under the key.
	ErrNotFound = casstore.ErrNotFound
	// ErrExists means Create found a value already stored under the key.
	ErrExists = casstore.ErrExists
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent.
	ErrInvalid = casstore.ErrInvalid
	// ErrTooLarge means an encoded value exceeds the backend's limit.
	// Nothing was sent.
	ErrTooLarge = casstore.ErrTooLarge
	// ErrAmbiguousCommit means the write was sent and the connection then
	// failed, so it may or may not have been applied. It is not retried:
	// re-read (Get) and decide.
	ErrAmbiguousCommit = casstore.ErrAmbiguousCommit
	// ErrClosed means the Store was closed before the update was sent.
	ErrClosed = casstore.ErrClosed
)

// panicError carries a panic out of an Update's fn, which may run on
// another caller's goroutine, to its own caller.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string {
	return fmt.Sprintf("cas: fn panicked: %v\n\n%s", e.value, e.stack)
}
