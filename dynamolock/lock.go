package dynamolock

import (
	"context"
	"sync"

	"github.com/nolock/nolock/internal/lockcore"
)

// The algorithm. Its parts: acquire.go takes a lock, heartbeat.go keeps
// it, writes.go holds the requests (the acquiring write, the read, the
// release), and this file the Lock; internal/lockcore, shared with package
// lease, runs the heartbeats, the deadlines and the Lock's end.
//
// A lock is an item. Acquiring writes it with one conditional UpdateItem:
// the item is absent, or released, or (takeover) still carries the record
// version number (RVN) this client has seen unchanged for a full lease of
// its own monotonic clock. The same write adds 1 to the fencing token and
// returns it. A holder's heartbeat writes a new random RVN conditional on
// its own; release writes one more, marks the item released, and keeps it
// (the token must never restart). No wall-clock instant is stored or
// compared: only this process's elapsed time counts.
//
// Every write carries an RVN generated before it is sent, so a write whose
// answer is lost (a timeout, a 5xx, a condition that failed on a re-send
// of a write that had applied) is resolved by reading the item: if
// it holds one of our RVNs, the write applied, and the lock is valid from
// the moment that write was sent. Local validity is only ever extended by
// a write known to have applied. A write that was not sent or was refused
// (internal/ddberr) changed nothing and is forgotten at once.

// Lock is a held lock. It heartbeats in the background until Release or
// Close, its maximum hold, or its loss, which closes Lost.
//
// A Lock is a lease: a holder paused past it (a GC pause, a stopped VM)
// wakes up still running its code, and Lost is closed only when its own
// goroutine runs again. To keep such a holder from corrupting what the lock
// protects, make the protected store check the fencing token (Token with
// dynamoconditional.Fenced or conditional.Fenced, or ConditionCheck).
// Methods are
// safe for concurrent use.
type Lock struct {
	h     *lockcore.Hold
	c     *Client
	ac    acquireConfig
	token int64

	mu      sync.Mutex
	rvn     sent   // the last write known to have applied
	pending []sent // later writes whose outcome is unknown
}

// newLock makes the Lock of write s, which applied, and registers it for
// heartbeats; its Context carries the values of caller, the acquiring
// context, but not its cancellation. If the Client was closed meanwhile,
// it releases the item instead (waiting at most a lease) and returns
// ErrClosed.
func (c *Client) newLock(caller context.Context, ac acquireConfig, s sent, token int64) (*Lock, error) {
	if !c.cfg.fencing {
		token = 0
	}
	l := &Lock{c: c, ac: ac, token: token, rvn: s, h: c.k.NewHold(caller, eventKey(ac.key, ac.sortKey), token, s.at, ac.maxHold)}
	l.h.Ref = l
	c.seen.forget(ac.key + "\x00" + ac.sortKey)
	if err := c.k.Add(l.h); err != nil {
		return nil, err
	}
	return l, nil
}

// Key returns the lock's partition key value.
func (l *Lock) Key() string { return l.ac.key }

// SortKey returns the lock's sort key value ("" if the table has none).
func (l *Lock) SortKey() string { return l.ac.sortKey }

// Token returns the lock's fencing token: larger than the token of every
// earlier acquisition of this key, constant for the lock's life (heartbeats
// do not change it). Pass it with every write to the protected resource,
// which must refuse a token lower than the highest it has seen
// (dynamoconditional.Fenced for DynamoDB items, conditional.Fenced for
// PostgreSQL rows). It is 0 when the Client was made WithoutFencing: such
// a lock has no token to fence with.
func (l *Lock) Token() int64 { return l.token }

// Data returns the payload this acquisition stored (WithData), or nil.
// The caller must not modify it.
func (l *Lock) Data() []byte { return l.ac.data }

// Lost returns a channel closed when the lock ends: a heartbeat found
// another client's write on the item (taken over), no heartbeat was
// confirmed within one lease on this process's clock (expired), the
// maximum hold passed, or Release or Close was called. Err says which.
// It is closed before a release is written, so a holder watching it learns
// of the end before anyone else can acquire the lock.
func (l *Lock) Lost() <-chan struct{} { return l.h.Lost() }

// Expiring returns a channel closed when less than the Client's expiry
// warning margin is left of the lock's local validity (its last confirmed
// heartbeat plus the lease) or of its maximum hold. It is checked against
// the remaining time, not at an instant, so it is closed even when the
// lock is found already expired (after a pause of the whole process), and
// always before Lost is closed for an expiry or the maximum hold. It is
// not closed by a release or a takeover: watch Lost for those.
func (l *Lock) Expiring() <-chan struct{} { return l.h.Expiring() }

// Context returns a context cancelled when Lost is closed, with Err as its
// cause (context.Cause), for work that should stop when the lock ends. It
// carries the values of the context Acquire or TryAcquire was called with
// (a trace ID, say), but not its deadline or cancellation: only the lock's
// end cancels it.
func (l *Lock) Context() context.Context { return l.h.Context() }

// Err returns nil while the lock is held; then ErrReleased after Release
// or Close, or a *LostError wrapping ErrLockLost that says why it was lost.
func (l *Lock) Err() error { return l.h.Err() }

// Release ends the lock: it stops the heartbeats (cancelling one in
// flight, and waiting for its answer), closes Lost, and writes the
// release conditional on the item still carrying one of this lock's record
// version numbers, so it can neither release a newer holder's lock nor be
// undone by a late heartbeat. With fencing on the item stays, marked
// released, so the token never restarts. A release whose answer was lost is
// retried until ctx ends; each attempt waits for its answer at most three
// quarters of the time ctx has left (a lease without a deadline), so a
// slow server gets nearly all of it and one answer that never comes
// leaves a quarter for a retry.
//
// It returns nil if the lock was held until the release; the *LostError if
// it had been lost before (the release is still written after an expiry,
// if nobody took the lock over, to spare the next holder a lease of
// waiting); or the error that kept the release from being written (then
// the item is released by its lease expiring). Release is idempotent: later
// calls (and Close) return the first one's result. A nil ctx is refused
// with ErrInvalid before anything: the Lock is still held, and renewed.
func (l *Lock) Release(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return l.h.Release(ctx)
}

// Close is Release with a context bounded by the lease, for defer: a
// release whose answer is lost is retried within it.
func (l *Lock) Close() error { return l.h.Close() }

// rvnsLocked returns every RVN of ours the item may carry. l.mu must be
// held.
func (l *Lock) rvnsLocked() []string {
	rvns := []string{l.rvn.rvn}
	for _, p := range l.pending {
		rvns = append(rvns, p.rvn)
	}
	return rvns
}
