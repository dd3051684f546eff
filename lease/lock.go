package lease

import (
	"context"

	"github.com/nolock/nolock/internal/lockcore"
)

// Lock is a held lock. It renews its lease in the background until
// Release or Close, its maximum hold, or its loss, which closes Lost.
//
// A Lock is a lease: a holder paused past it (a GC pause, a stopped VM)
// wakes up still running its code, and Lost is closed only when its own
// goroutine runs again. To keep such a holder from corrupting what the
// lock protects, make the protected store check the fencing token (Token
// with conditional.Fenced, or FenceSQL in your own statements). Methods
// are safe for concurrent use.
type Lock struct {
	h  *lockcore.Hold
	c  *Client
	ac acquireConfig
}

// newLock makes the Lock that statement s took with token, and registers
// it for renewal; its Context carries the values of caller, the acquiring
// context, but not its cancellation. If the Client was closed meanwhile,
// it releases the row instead (waiting at most a lease) and returns
// ErrClosed.
func (c *Client) newLock(caller context.Context, ac acquireConfig, s sent, token int64) (*Lock, error) {
	l := &Lock{c: c, ac: ac, h: c.k.NewHold(caller, ac.key, token, s.at, ac.maxHold)}
	l.h.Ref = l
	if err := c.k.Add(l.h); err != nil {
		return nil, err
	}
	return l, nil
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.ac.key }

// Token returns the lock's fencing token: larger than the token of every
// earlier acquisition of this key (the row is never deleted, and only an
// acquisition changes it), constant for the lock's life. Pass it with
// every write to the protected resource, which must refuse a token lower
// than the highest it has seen (conditional.Fenced), or add FenceSQL to
// your statements on the same database.
func (l *Lock) Token() int64 { return l.h.Token }

// Data returns the payload this acquisition stored (WithData), or nil.
// The caller must not modify it.
func (l *Lock) Data() []byte { return l.ac.data }

// Lost returns a channel closed when the lock ends: a renewal found the
// row taken over or expired on the database's clock, no renewal was
// confirmed within the local validity (see the package doc), the maximum
// hold passed, or Release or Close was called. Err says which. It is
// closed before a release is written, so a holder watching it learns of
// the end before anyone else can acquire the lock.
func (l *Lock) Lost() <-chan struct{} { return l.h.Lost() }

// Expiring returns a channel closed when less than the Client's expiry
// warning margin is left of the lock's local validity or of its maximum
// hold. It is checked against the remaining time, not at an instant, so
// it is closed even when the lock is found already expired (after a pause
// of the whole process), and always before Lost is closed for an expiry
// or the maximum hold. It is not closed by a release or a takeover: watch
// Lost for those.
func (l *Lock) Expiring() <-chan struct{} { return l.h.Expiring() }

// Context returns a context cancelled when Lost is closed, with Err as its
// cause (context.Cause), for work that should stop when the lock ends. It
// carries the values of the context Acquire or TryAcquire was called with,
// but not its deadline or cancellation.
func (l *Lock) Context() context.Context { return l.h.Context() }

// Err returns nil while the lock is held; then ErrReleased after Release
// or Close, or a *LostError wrapping ErrLockLost that says why it was lost.
func (l *Lock) Err() error { return l.h.Err() }

// Release ends the lock: no renewal of it starts after this (one in flight
// is not waited for: a renewal applies only to a row not yet released, so
// it cannot undo the release), it closes Lost, and marks the row released
// if it still carries this lock's token. The row and its token stay, so
// the token never restarts, and the next acquirer needs no lock-delay
// (unless the release is lost, below). A release whose answer was lost is
// resolved by trying again until ctx ends (a try that finds the row
// released with our token is success); each try waits for its answer at
// most three quarters of the time ctx has left (a lease without a
// deadline), and none is cancelled on the server once sent.
// The release commits asynchronously: it is visible at once but not
// flushed or replicated before Release returns, so a crash or failover
// before the server's WAL writer flushes it (within 3 x wal_writer_delay)
// or a later synchronous commit carries it may undo it, leaving the row
// held until its lease and lock-delay run out (the token is unchanged
// either way). It waits for the row only if another transaction holds it
// (a FenceSQL write, a renewal still committing).
//
// It returns nil if the lock was held until the release; the *LostError if
// it had been lost before (the release is still written after an expiry,
// if nobody took the lock over, to spare the next holder the lock-delay);
// or the error that kept the release from being written (then the row is
// freed by its lease and the lock-delay running out). Release is
// idempotent: later calls (and Close) return the first one's result. A
// nil ctx is refused with ErrInvalid before anything: the Lock is still
// held, and renewed.
func (l *Lock) Release(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return l.h.Release(ctx)
}

// Close is Release with a context bounded by the lease, for defer.
func (l *Lock) Close() error { return l.h.Close() }
