package lease

import (
	"errors"
	"fmt"

	"github.com/nolock/nolock/internal/errfmt"
)

var (
	// ErrNotAcquired means the lock is held by someone else: TryAcquire
	// found it held, or Acquire's wait limit passed. It is wrapped by a
	// *HeldError that names the holder. Nothing was changed.
	ErrNotAcquired = errors.New("lease: not acquired")

	// ErrLockLost means a lock ended for another reason than its own
	// Release: a newer holder took it over, its lease ran out, or its
	// maximum hold passed. It is wrapped by a *LostError that says which.
	ErrLockLost = errors.New("lease: lock lost")

	// ErrReleased is what (*Lock).Err returns after Release or Close.
	ErrReleased = errors.New("lease: lock released")

	// ErrInvalid means bad input (an empty key, a heartbeat longer than
	// half the lease, ...). The message names the argument; no I/O was
	// done.
	ErrInvalid = errors.New("lease: invalid argument")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("lease: client closed")
)

func invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// HeldError is the error of an acquisition that found the lock held by
// someone else. It wraps ErrNotAcquired. The fields are what the lock row
// said when it was last read; the holder may have changed since. It is a
// value: read it from any goroutine, do not modify Data.
type HeldError struct {
	Key   string // the lock's key
	Owner string // the holder's owner name ("" if the row was not seen)
	Token int64  // the holder's fencing token (0 if the row was not seen)
	Data  []byte // the holder's data payload, nil if none
}

// Error names the lock and its holder.
func (e *HeldError) Error() string {
	return fmt.Sprintf("lease: lock %q held by %q", e.Key, e.Owner)
}

// Unwrap returns ErrNotAcquired.
func (e *HeldError) Unwrap() error { return ErrNotAcquired }

// Cause says why a lock was lost. It is a plain value, with
// dynamolock.Cause's values.
type Cause int

// The causes of a loss.
const (
	// TakenOver: the row carries a newer token (another client acquired
	// the lock after this lease ran out), or it was marked released.
	TakenOver Cause = iota + 1
	// Expired: the lease ran out before a renewal was confirmed, on the
	// holder's own clock (the database was unreachable or slow, or the
	// process was paused) or on the database's (a renewal came too late).
	Expired
	// MaxHold: the lock reached its maximum total hold (WithMaxHold) and
	// was released.
	MaxHold
)

// String says the cause in words.
func (c Cause) String() string {
	switch c {
	case TakenOver:
		return "taken over"
	case Expired:
		return "lease expired"
	case MaxHold:
		return "maximum hold reached"
	}
	return fmt.Sprintf("Cause(%d)", int(c))
}

// LostError is why a lock was lost (a value, safe to share).
// errors.Is(err, ErrLockLost) holds; Last, the last database error the
// renewals saw (nil if none), is also in the chain, so a caller can tell
// "taken over" from "database unreachable".
type LostError struct {
	Key   string
	Cause Cause
	Owner string // for TakenOver: the owner name the row carried, if read
	Token int64  // for TakenOver: the token the row carried, if read
	Last  error
}

// Error names the lock, the cause and, if any, the new owner and the last
// database error.
func (e *LostError) Error() string {
	s := fmt.Sprintf("lease: lock %q lost: %s", e.Key, e.Cause)
	if e.Owner != "" {
		s += fmt.Sprintf(" (row owned by %q, token %d)", e.Owner, e.Token)
	}
	if e.Last != nil {
		s += fmt.Sprintf(" (last error: %v)", e.Last)
	}
	return s
}

// Unwrap returns ErrLockLost and Last.
func (e *LostError) Unwrap() []error {
	if e.Last == nil {
		return []error{ErrLockLost}
	}
	return []error{ErrLockLost, e.Last}
}
