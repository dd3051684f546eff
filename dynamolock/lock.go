package dynamolock

import (
	"context"
	"errors"
	"github.com/nolock/nolock/observe"
	"sync"
	"time"
)

// The algorithm. Its parts: acquire.go takes a lock, heartbeat.go keeps
// it, writes.go holds the requests (the acquiring write, the read, the
// release), and this file the Lock and how it ends.
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
	c       *Client
	ac      acquireConfig
	token   int64
	start   time.Time // when the acquiring write was sent
	stopHB  context.CancelFunc
	done    chan struct{} // closed when the heartbeat goroutine has ended
	stopped sync.Once

	lost, expiring chan struct{}
	ctx            context.Context
	cancelCtx      context.CancelCauseFunc

	mu         sync.Mutex
	rvn        sent   // the last write known to have applied
	pending    []sent // later writes whose outcome is unknown
	validUntil time.Time
	err        error
	warned     bool
	stopping   bool // Release has begun: no new heartbeat may start
	inFlight   bool // a heartbeat is on the wire

	release    sync.Once
	releaseErr error
}

// newLock makes the Lock of write s, which applied, and starts its
// heartbeats; its Context carries the values of caller, the acquiring
// context, but not its cancellation. If the Client was closed meanwhile,
// it releases the item instead (waiting at most a lease) and returns
// ErrClosed.
func (c *Client) newLock(caller context.Context, ac acquireConfig, s sent, token int64) (*Lock, error) {
	if !c.cfg.fencing {
		token = 0
	}
	hbCtx, stop := context.WithCancel(context.Background())
	l := &Lock{
		c: c, ac: ac, token: token, start: s.at, stopHB: stop, done: make(chan struct{}),
		lost: make(chan struct{}), expiring: make(chan struct{}),
		rvn: s, validUntil: s.at.Add(c.cfg.lease),
	}
	l.ctx, l.cancelCtx = context.WithCancelCause(context.WithoutCancel(caller))
	c.seen.forget(ac.key + "\x00" + ac.sortKey)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stop()
		close(l.done)
		l.lose(ErrReleased)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
		defer cancel()
		_ = c.writeRelease(ctx, ac, []string{s.rvn})
		return nil, ErrClosed
	}
	c.locks[l] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go l.run(hbCtx)
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
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Expiring returns a channel closed when less than the Client's expiry
// warning margin is left of the lock's local validity (its last confirmed
// heartbeat plus the lease) or of its maximum hold. It is checked against
// the remaining time, not at an instant, so it is closed even when the
// lock is found already expired (after a pause of the whole process), and
// always before Lost is closed for an expiry or the maximum hold. It is
// not closed by a release or a takeover: watch Lost for those.
func (l *Lock) Expiring() <-chan struct{} { return l.expiring }

// Context returns a context cancelled when Lost is closed, with Err as its
// cause (context.Cause), for work that should stop when the lock ends. It
// carries the values of the context Acquire or TryAcquire was called with
// (a trace ID, say), but not its deadline or cancellation: only the lock's
// end cancels it.
func (l *Lock) Context() context.Context { return l.ctx }

// Err returns nil while the lock is held; then ErrReleased after Release
// or Close, or a *LostError wrapping ErrLockLost that says why it was lost.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// lose ends the lock with err (the first reason sticks). For an expiry or
// the maximum hold it closes Expiring first, if it is still open.
func (l *Lock) lose(err error) {
	var le *LostError
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return
	}
	// A late wake-up may find the warning's time passed too.
	warned := errors.As(err, &le) && (le.Cause == Expired || le.Cause == MaxHold) && l.warnLocked()
	l.err = err
	close(l.lost)
	l.cancelCtx(err)
	l.mu.Unlock()
	if warned {
		l.event(EventExpiring, 0, nil)
	}
	if le != nil {
		l.c.log.Warn("dynamolock: lock lost", "key", lockName(l.ac.key, l.ac.sortKey), "err", err)
		l.event(EventLost, 0, err)
	}
}

// warnLocked closes Expiring, once, and reports whether it did. l.mu must
// be held.
func (l *Lock) warnLocked() bool {
	if l.warned {
		return false
	}
	l.warned = true
	close(l.expiring)
	return true
}

// event reports an event of the lock to the Client's observer.
func (l *Lock) event(name string, d time.Duration, err error) {
	l.c.events.Notify(l.ctx, observe.Event{Name: name, Key: eventKey(l.ac.key, l.ac.sortKey), Token: l.token, Duration: d, Err: err})
}

// Release ends the lock: it stops the heartbeats (cancelling one in
// flight, and waiting for the goroutine), closes Lost, and writes the
// release conditional on the item still carrying one of this lock's record
// version numbers, so it can neither release a newer holder's lock nor be
// undone by a late heartbeat. With fencing on the item stays, marked
// released, so the token never restarts. A release whose answer was lost is
// retried until ctx ends; each attempt waits at most a quarter of the lease
// for its answer, so one answer that never comes does not use up ctx.
//
// It returns nil if the lock was held until the release; the *LostError if
// it had been lost before (the release is still written after an expiry,
// if nobody took the lock over, to spare the next holder a lease of
// waiting); or the error that kept the release from being written (then
// the item is released by its lease expiring). Release is idempotent: later
// calls (and Close) return the first one's result.
func (l *Lock) Release(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	// Stop the heartbeats. Without one in flight, the RVNs are final at
	// once and the release need not wait for the goroutine to notice;
	// with one, its outcome must be known first.
	l.mu.Lock()
	l.stopping = true
	inFlight := l.inFlight
	l.mu.Unlock()
	l.stopped.Do(l.stopHB)
	if inFlight {
		<-l.done
	}
	l.lose(ErrReleased)
	l.releaseItem(ctx)
	<-l.done
	if err := l.Err(); !errors.Is(err, ErrReleased) {
		return err
	}
	if l.releaseErr == nil {
		l.event(EventReleased, l.c.cfg.now().Sub(l.start), nil)
	}
	return l.releaseErr
}

// releaseItem writes the release once, unless the lock was taken over
// (then there is nothing of ours to release). No heartbeat may be in
// flight.
func (l *Lock) releaseItem(ctx context.Context) {
	l.release.Do(func() {
		defer l.c.forget(l)
		l.mu.Lock()
		err := l.err
		rvns := l.rvnsLocked()
		l.mu.Unlock()
		var le *LostError
		if errors.As(err, &le) && le.Cause == TakenOver {
			return
		}
		l.releaseErr = l.c.writeRelease(ctx, l.ac, rvns)
	})
}

// Close is Release with a context bounded by the lease, for defer: a
// release whose answer is lost is retried (several times) within it.
func (l *Lock) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.lease)
	defer cancel()
	return l.Release(ctx)
}

// rvnsLocked returns every RVN of ours the item may carry. l.mu must be
// held.
func (l *Lock) rvnsLocked() []string {
	rvns := []string{l.rvn.rvn}
	for _, p := range l.pending {
		rvns = append(rvns, p.rvn)
	}
	return rvns
}
