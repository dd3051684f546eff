package dynamoconditional

import "github.com/nolock/nolock/internal/condcore"

// The errors of this package. Package conditional returns the same values,
// so errors.Is matches them whichever backend returned them; each
// comment says what the error means.
var (
	ErrSoldOut         = condcore.ErrSoldOut         // the stock cannot cover the request: nothing taken
	ErrInsufficient    = condcore.ErrInsufficient    // the balance cannot cover the debit: nothing taken
	ErrNotFound        = condcore.ErrNotFound        // no item for the key: nothing changed
	ErrInvalid         = condcore.ErrInvalid         // bad input, named in the text; nothing sent
	ErrAmbiguousCommit = condcore.ErrAmbiguousCommit // sent, then the answer was lost: may have applied
	ErrHeld            = condcore.ErrHeld            // another holder's hold has not expired: nothing changed
	ErrConfirmed       = condcore.ErrConfirmed       // the resource's hold was confirmed: nothing changed
	ErrNotHolder       = condcore.ErrNotHolder       // the caller does not hold the resource: nothing changed
	ErrFenced          = condcore.ErrFenced          // a newer fencing token exists: nothing written
	ErrClosed          = condcore.ErrClosed          // the Stock was closed before the take was sent: nothing taken
)

// HoldError says which resource could not be held and why: Err is ErrHeld,
// ErrConfirmed or ErrNotFound, and errors.Is sees through to it. Hold,
// HoldAll and HoldAny return it; nothing was held.
type HoldError struct {
	Resource string
	Err      error
}

// Error names the resource and the reason.
func (e *HoldError) Error() string { return condcore.HoldMessage(e.Resource, e.Err) }

// Unwrap returns the reason, ErrHeld, ErrConfirmed or ErrNotFound.
func (e *HoldError) Unwrap() error { return e.Err }

// MaxKeyLen bounds a key's length in bytes.
const MaxKeyLen = condcore.MaxKeyLen
