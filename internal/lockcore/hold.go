package lockcore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Cause says why a lock was lost; each package exports its own Cause with
// the same values.
type Cause int

// The causes of a loss.
const (
	TakenOver Cause = iota + 1 // the store says another holder has it, or it was released
	Expired                    // no renewal was confirmed within the local validity
	MaxHold                    // the maximum hold passed
)

// Loss is a lock's end as the core and its backends see it. It is never
// returned to a caller: Backend.Lost turns it into the package's
// *LostError.
type Loss struct {
	Cause Cause
	Owner string // for TakenOver: the owner the store carried, if read
	Token int64  // for TakenOver: the token the store carried, if read
	Last  error  // the last renewal's error, if any
}

func (l *Loss) Error() string { return "lock lost" }

// Hold is the life of one held lock: its Lost and Expiring channels, its
// Context, its error, its local validity and an idempotent release. The
// package's Lock wraps one; the Keeper renews it. Methods are safe for
// concurrent use.
type Hold struct {
	k     *Keeper
	Ref   any    // the package's Lock, for its Backend
	Key   string // the lock in events and logs
	Token int64
	start time.Time // when the acquiring call was sent
	maxAt time.Time // the end of the maximum hold; zero: none

	lost, expiring chan struct{}
	ctx            context.Context
	cancelCtx      context.CancelCauseFunc

	mu       sync.Mutex
	valid    time.Time // the local validity, on the Keeper's clock
	err      error
	loss     *Loss
	warned   bool
	stopping bool  // Release has begun: no renewal may start
	call     *call // the renewal in flight, nil if none

	// The renewal loop's own.
	next     time.Time // when the next renewal is due
	failures int       // renewals in a row that failed
	last     error     // the last one's error; nil after one that was confirmed
	cut      bool      // the last renewal's call was cut off at its time bound
	held     bool      // due, it was left waiting for a call in flight to answer

	release    sync.Once
	releaseErr error
}

// call is one renewal call in flight, for one lock or a batch.
type call struct {
	at     time.Time
	bound  time.Duration // how long it may wait for its answer
	cancel context.CancelFunc
	done   chan struct{} // closed when the call has returned
}

// NewHold makes the Hold of a lock acquired by a call sent at start, with
// token; its Context carries the values of caller, not its cancellation.
// Register it with Add once Ref is set. Its first renewal is due between
// half a heartbeat and a heartbeat after start (random), so that locks
// acquired together do not renew together.
func (k *Keeper) NewHold(caller context.Context, key string, token int64, start time.Time, maxHold time.Duration) *Hold {
	h := &Hold{
		k: k, Key: key, Token: token, start: start,
		lost: make(chan struct{}), expiring: make(chan struct{}),
		valid: start.Add(k.cfg.Lease),
		next:  start.Add(Jitter(k.cfg.Heartbeat)),
	}
	if maxHold > 0 {
		h.maxAt = start.Add(maxHold)
	}
	h.ctx, h.cancelCtx = context.WithCancelCause(context.WithoutCancel(caller))
	return h
}

// Start returns when the acquiring call was sent.
func (h *Hold) Start() time.Time { return h.start }

// Lost returns a channel closed when the lock ends.
func (h *Hold) Lost() <-chan struct{} { return h.lost }

// Expiring returns a channel closed when less than the warning margin is
// left of the local validity or of the maximum hold.
func (h *Hold) Expiring() <-chan struct{} { return h.expiring }

// Context returns a context cancelled with Err when Lost is closed.
func (h *Hold) Context() context.Context { return h.ctx }

// Err returns nil while the lock is held, then why it ended.
func (h *Hold) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// ValidUntil returns the end of the local validity.
func (h *Hold) ValidUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.valid
}

// extend moves the local validity to v, if that is later.
func (h *Hold) extend(v time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v.After(h.valid) {
		h.valid = v
	}
}

// end ends the lock with loss, as the package's error.
func (h *Hold) end(loss *Loss) { h.finish(h.k.be.Lost(h, loss), loss) }

// finish ends the lock with err (the first reason sticks): it closes Lost
// and cancels the Context. For an expiry or the maximum hold it closes
// Expiring first, if it is still open.
func (h *Hold) finish(err error, loss *Loss) {
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		return
	}
	// A late wake-up may find the warning's time passed too.
	warned := loss != nil && (loss.Cause == Expired || loss.Cause == MaxHold) && h.warnLocked()
	h.err, h.loss = err, loss
	close(h.lost)
	h.cancelCtx(err)
	h.mu.Unlock()
	h.k.unrenew(h)
	if warned {
		h.event(h.k.cfg.Events.Expiring, 0, nil)
	}
	if loss != nil {
		h.k.log.Warn(h.k.cfg.Prefix+": lock lost", "key", h.Key, "token", h.Token, "err", err)
		h.event(h.k.cfg.Events.Lost, 0, err)
	}
}

// warnLocked closes Expiring, once, and reports whether it did. h.mu must
// be held.
func (h *Hold) warnLocked() bool {
	if h.warned {
		return false
	}
	h.warned = true
	close(h.expiring)
	return true
}

// event reports an event of the lock to the observer.
func (h *Hold) event(name string, d time.Duration, err error) {
	h.k.events.Notify(h.ctx, observe.Event{Name: name, Key: h.Key, Token: h.Token, Duration: d, Err: err})
}

// Release ends the lock: no renewal starts after it begins; one in flight
// is cancelled and waited for if the backend needs its outcome
// (Config.WaitRenewal), else left to fail. Then Lost is closed and the
// backend's release written once, unless the lock was taken over. It
// returns nil if the lock was held until the release, the package's lost
// error if it had been lost before, or the error of the release. It is a
// call of the observer's (Events.Release), ended with Events.Released or
// Events.NotReleased.
func (h *Hold) Release(ctx context.Context) error {
	ctx, sp := observed.Start(h.k.cfg.Observer, ctx, observe.Call{Name: h.k.cfg.Events.Release, Key: h.Key})
	e, err := h.settle(ctx)
	sp.End(e)
	return err
}

// Close is Release with a context bounded by the lease.
func (h *Hold) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), h.k.cfg.Lease)
	defer cancel()
	return h.Release(ctx)
}

// shut is Close for the Keeper's Close: no call of the user's, so a
// release is an event through the queue, as the lock's others.
func (h *Hold) shut() error {
	ctx, cancel := context.WithTimeout(context.Background(), h.k.cfg.Lease)
	defer cancel()
	e, err := h.settle(ctx)
	if err == nil {
		h.k.events.Notify(h.ctx, e)
	}
	return err
}

// settle is Release's work; it returns the outcome's event too.
func (h *Hold) settle(ctx context.Context) (observe.Event, error) {
	h.k.await(h.stop())
	h.finish(h.k.cfg.Released, nil)
	h.releaseOnce(ctx)
	e := observe.Event{Name: h.k.cfg.Events.Released, Key: h.Key, Token: h.Token, Duration: h.k.cfg.Now().Sub(h.start)}
	err := h.Err()
	if errors.Is(err, h.k.cfg.Released) {
		err = h.releaseErr
	}
	if err != nil {
		e.Name, e.Err = h.k.cfg.Events.NotReleased, err
		if !errors.Is(h.Err(), h.k.cfg.Released) {
			e.Duration = 0 // lost before: its lost event ended the hold
		}
	}
	return e, err
}

// releaseOnce writes the release once, unless the lock was taken over
// (then nothing of ours is left to release).
func (h *Hold) releaseOnce(ctx context.Context) {
	h.release.Do(func() {
		defer h.k.forget(h)
		h.mu.Lock()
		taken := h.loss != nil && h.loss.Cause == TakenOver
		h.mu.Unlock()
		if taken {
			return
		}
		err := h.k.be.Release(ctx, h)
		if loss := (*Loss)(nil); errors.As(err, &loss) {
			err = h.k.be.Lost(h, loss)
		}
		h.releaseErr = err
	})
}

// endMaxHold ends the lock at its maximum hold: Lost first, then the
// release, in a goroutine the Keeper's Close waits for, written once no
// renewal the backend must wait for is in flight (waiting at most a
// lease).
func (h *Hold) endMaxHold() {
	h.end(&Loss{Cause: MaxHold})
	c := h.stop()
	h.k.wg.Add(1)
	go func() {
		defer h.k.wg.Done()
		h.k.await(c)
		ctx, cancel := context.WithTimeout(context.Background(), h.k.cfg.Lease)
		defer cancel()
		h.releaseOnce(ctx)
	}()
}

// stop makes sure no renewal of h starts from now on, and returns the one
// in flight, if any.
func (h *Hold) stop() *call {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopping = true
	return h.call
}

// await waits for the renewal c (nil: none) to return if the backend
// needs its outcome (Config.WaitRenewal), cancelling it first unless it
// renews a batch, whose other locks still need its answer.
func (k *Keeper) await(c *call) {
	if c == nil || !k.cfg.WaitRenewal {
		return
	}
	if !k.cfg.Batch {
		c.cancel()
	}
	<-c.done
}
