package dynamolock

import (
	"errors"
	"fmt"

	"github.com/nolock/nolock/internal/errfmt"
)

var (
	// ErrNotAcquired means the lock is held by someone else: TryAcquire
	// found it held, or Acquire's wait limit passed. It is wrapped by a
	// *HeldError that names the holder. Nothing was changed.
	ErrNotAcquired = errors.New("dynamolock: not acquired")

	// ErrLockLost means a lock ended for another reason than its own
	// Release: a newer holder took it over, its lease ran out on the
	// holder's own clock, or its maximum hold passed. It is wrapped by a
	// *LostError that says which.
	ErrLockLost = errors.New("dynamolock: lock lost")

	// ErrReleased is what (*Lock).Err returns after Release or Close.
	ErrReleased = errors.New("dynamolock: lock released")

	// ErrFenced means a write guarded by a lock's fencing token was refused
	// because a newer holder exists (its token is higher). Nothing was
	// written.
	ErrFenced = errors.New("dynamolock: fenced by a newer token")

	// ErrInvalid means bad input (an empty key, a heartbeat longer than half
	// the lease, ...). The message names the argument; no I/O was done.
	ErrInvalid = errors.New("dynamolock: invalid argument")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("dynamolock: client closed")
)

func invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// HeldError is the error of an acquisition that found the lock held by
// someone else. It wraps ErrNotAcquired. The fields are what the lock item
// said when it was last read; the holder may have changed since. It is a
// value: read it from any goroutine, do not modify Data.
type HeldError struct {
	Key     string // the lock's partition key value
	SortKey string // the lock's sort key value, if the table has one
	Owner   string // the holder's owner name ("" if the item was not seen)
	Token   int64  // the holder's fencing token (0 if not seen, or written without one)
	Data    []byte // the holder's data payload, nil if none
}

// Error names the lock and its holder.
func (e *HeldError) Error() string {
	return fmt.Sprintf("dynamolock: %s held by %q", lockName(e.Key, e.SortKey), e.Owner)
}

// Unwrap returns ErrNotAcquired.
func (e *HeldError) Unwrap() error { return ErrNotAcquired }

// Cause says why a lock was lost. It is a plain value, with lease.Cause's
// values.
type Cause int

// The causes of a loss.
const (
	// TakenOver: a heartbeat found that another client had written the lock
	// item (it took the lock over, or the item was released or deleted).
	TakenOver Cause = iota + 1
	// Expired: no heartbeat was confirmed within one lease, on the holder's
	// own clock (DynamoDB was unreachable, or the process was paused). The
	// item may still carry the holder's version until someone takes it over.
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
		return "lease expired on the holder's clock"
	case MaxHold:
		return "maximum hold reached"
	}
	return fmt.Sprintf("Cause(%d)", int(c))
}

// LostError is why a lock was lost (a value, safe to share).
// errors.Is(err, ErrLockLost) holds; Last, the last DynamoDB error the
// heartbeats saw (nil if none), is also in the chain, so a caller can tell
// "taken over" from "DynamoDB unreachable".
type LostError struct {
	Key, SortKey string
	Cause        Cause
	Owner        string // for TakenOver: the owner name the item carried, if any
	Token        int64  // for TakenOver: the fencing token the item carried, if any
	Last         error
}

// Error names the lock, the cause and, if any, the new owner and the last
// DynamoDB error.
func (e *LostError) Error() string {
	s := fmt.Sprintf("dynamolock: %s lost: %s", lockName(e.Key, e.SortKey), e.Cause)
	if e.Owner != "" {
		s += fmt.Sprintf(" (item owned by %q, token %d)", e.Owner, e.Token)
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

// eventKey is a lock's Key in observe.Events: the key, and "/" and the
// sort key when there is one.
func eventKey(key, sortKey string) string {
	if sortKey == "" {
		return key
	}
	return key + "/" + sortKey
}

func lockName(key, sortKey string) string {
	if sortKey == "" {
		return fmt.Sprintf("lock %q", key)
	}
	return fmt.Sprintf("lock %q/%q", key, sortKey)
}
