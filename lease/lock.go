package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nolock/nolock/observe"
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
	c       *Client
	ac      acquireConfig
	token   int64
	start   time.Time // when the acquiring statement was sent
	stop    context.CancelFunc
	starter *time.Timer   // starts the renewal goroutine at its first wake
	done    chan struct{} // closed when the renewal goroutine has ended (or was never started)

	lost, expiring chan struct{}
	ctx            context.Context
	cancelCtx      context.CancelCauseFunc

	mu         sync.Mutex
	validUntil time.Time // on this Client's clock
	err        error
	warned     bool

	release    sync.Once
	releaseErr error
}

// newLock makes the Lock that statement s took with token, and starts its
// renewals; its Context carries the values of caller, the acquiring
// context, but not its cancellation. If the Client was closed meanwhile,
// it releases the row instead (waiting at most a lease) and returns
// ErrClosed.
func (c *Client) newLock(caller context.Context, ac acquireConfig, s sent, token int64) (*Lock, error) {
	rctx, stop := context.WithCancel(context.Background())
	l := &Lock{
		c: c, ac: ac, token: token, start: s.at, stop: stop, done: make(chan struct{}),
		lost: make(chan struct{}), expiring: make(chan struct{}),
		validUntil: s.at.Add(c.cfg.lease),
	}
	l.ctx, l.cancelCtx = context.WithCancelCause(context.WithoutCancel(caller))
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stop()
		close(l.done)
		l.lose(ErrReleased)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
		defer cancel()
		_ = l.writeRelease(ctx)
		return nil, ErrClosed
	}
	c.locks[l] = struct{}{}
	c.wg.Add(1)
	// The renewal goroutine starts at its first wake (a heartbeat, or the
	// warning or the maximum hold if sooner): a lock released before then
	// costs no goroutine.
	l.starter = time.AfterFunc(l.firstWake(), func() { l.run(rctx) })
	c.mu.Unlock()
	return l, nil
}

// firstWake is how long after now the renewal goroutine has its first
// thing to do: a heartbeat, the Expiring warning, or the end of the
// maximum hold, whichever comes first.
func (l *Lock) firstWake() time.Duration {
	cfg := l.c.cfg
	d := min(cfg.heartbeat, cfg.lease-cfg.warn)
	if l.ac.maxHold > 0 {
		d = min(d, l.ac.maxHold-cfg.warn)
	}
	return d - cfg.now().Sub(l.start)
}

// halt ends the renewals: it cancels them, and when their goroutine has
// not started, ends them itself (done closes at once).
func (l *Lock) halt() {
	l.stop()
	if l.starter.Stop() {
		close(l.done)
		l.c.wg.Done()
	}
}

// Key returns the lock's key.
func (l *Lock) Key() string { return l.ac.key }

// Token returns the lock's fencing token: larger than the token of every
// earlier acquisition of this key (the row is never deleted, and only an
// acquisition changes it), constant for the lock's life. Pass it with
// every write to the protected resource, which must refuse a token lower
// than the highest it has seen (conditional.Fenced), or add FenceSQL to
// your statements on the same database.
func (l *Lock) Token() int64 { return l.token }

// Data returns the payload this acquisition stored (WithData), or nil.
// The caller must not modify it.
func (l *Lock) Data() []byte { return l.ac.data }

// Lost returns a channel closed when the lock ends: a renewal found the
// row taken over or expired on the database's clock, no renewal was
// confirmed within the local validity (see the package doc), the maximum
// hold passed, or Release or Close was called. Err says which. It is
// closed before a release is written, so a holder watching it learns of
// the end before anyone else can acquire the lock.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Expiring returns a channel closed when less than the Client's expiry
// warning margin is left of the lock's local validity or of its maximum
// hold. It is checked against the remaining time, not at an instant, so
// it is closed even when the lock is found already expired (after a pause
// of the whole process), and always before Lost is closed for an expiry
// or the maximum hold. It is not closed by a release or a takeover: watch
// Lost for those.
func (l *Lock) Expiring() <-chan struct{} { return l.expiring }

// Context returns a context cancelled when Lost is closed, with Err as its
// cause (context.Cause), for work that should stop when the lock ends. It
// carries the values of the context Acquire or TryAcquire was called with,
// but not its deadline or cancellation.
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
	warned := errors.As(err, &le) && (le.Cause == Expired || le.Cause == MaxHold) && l.warnLocked()
	l.err = err
	close(l.lost)
	l.cancelCtx(err)
	l.mu.Unlock()
	if warned {
		l.event(EventExpiring, 0, nil)
	}
	if le != nil {
		l.c.log.Warn("lease: lock lost", "key", l.ac.key, "token", l.token, "err", err)
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
	l.c.events.Notify(l.ctx, observe.Event{Name: name, Key: l.ac.key, Token: l.token, Duration: d, Err: err})
}

// Release ends the lock: it stops the renewals (one in flight is no longer
// waited for: a renewal applies only to a row not yet released, so it
// cannot undo the release), waits for the renewal goroutine, closes Lost,
// and marks the row released if it still carries this lock's token. The
// row and its token stay, so the token never restarts, and the next
// acquirer needs no lock-delay (unless the release is lost, below). A
// release whose answer was lost is
// resolved by trying again until ctx ends (a try that finds the row
// released with our token is success); each try waits at most a quarter of
// the lease for its answer, and none is cancelled on the server once sent.
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
	l.halt()
	<-l.done
	l.lose(ErrReleased)
	l.releaseRow(ctx)
	if err := l.Err(); !errors.Is(err, ErrReleased) {
		return err
	}
	if l.releaseErr == nil {
		l.event(EventReleased, l.c.cfg.now().Sub(l.start), nil)
	}
	return l.releaseErr
}

// releaseRow writes the release once, unless the lock was taken over.
func (l *Lock) releaseRow(ctx context.Context) {
	l.release.Do(func() {
		defer l.c.forget(l)
		var le *LostError
		if errors.As(l.Err(), &le) && le.Cause == TakenOver {
			return
		}
		l.releaseErr = l.writeRelease(ctx)
	})
}

// Close is Release with a context bounded by the lease, for defer.
func (l *Lock) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.lease)
	defer cancel()
	return l.Release(ctx)
}
