package lockcore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// Renewed is the result of one lock's renewal.
type Renewed struct {
	At    time.Time // when the renewal (or the read that confirmed it) was sent
	Valid time.Time // the local validity it confirmed
	Err   error     // a *Loss ends the lock; any other error is retried
}

// Backend is what a store supplies to the core.
type Backend interface {
	// Renew renews hs (one lock unless Config.Batch) and returns one
	// result per lock, in order. ctx ends when the call's time is up or
	// the renewals must stop.
	Renew(ctx context.Context, hs []*Hold) []Renewed
	// Release writes h's release. It returns nil once it is known to
	// have applied, a *Loss when the store carries another holder, or
	// the error that kept it from being written.
	Release(ctx context.Context, h *Hold) error
	// Lost returns the package's error (its *LostError) for a loss.
	Lost(h *Hold, loss *Loss) error
}

// Events are the package's event names, and the names of its calls
// (observe.Call.Name).
type Events struct {
	Acquired, NotAcquired, Renewed, RenewFailed, Expiring, Lost, Released, NotReleased string
	Acquire, TryAcquire, Release                                                       string
}

// EventsOf returns the event and call names of package pkg:
// "pkg.acquired", "pkg.acquire" and so on, as the package's EventX and
// CallX constants spell them.
func EventsOf(pkg string) Events {
	return Events{Acquired: pkg + ".acquired", NotAcquired: pkg + ".not_acquired", Renewed: pkg + ".renewed",
		RenewFailed: pkg + ".renew_failed", Expiring: pkg + ".expiring", Lost: pkg + ".lost", Released: pkg + ".released",
		NotReleased: pkg + ".not_released",
		Acquire:     pkg + ".acquire", TryAcquire: pkg + ".try_acquire", Release: pkg + ".release"}
}

// Config is a Keeper's settings: the checked Settings and what the
// package supplies.
type Config struct {
	Settings
	// Batch renews, when one lock is due, every lock with no renewal in
	// flight, in one call (lease: one statement); without it each lock
	// is renewed by a call of its own, at its own time (dynamolock).
	Batch bool
	// WaitRenewal makes Release and the maximum hold wait for a renewal
	// in flight, whose outcome the release needs (dynamolock's RVNs).
	WaitRenewal bool
	// MaxCalls bounds the renewal calls in flight at once without Batch
	// (0: no bound). Beyond it, due locks wait, those with the least time
	// left first: a store slower than the locks' heartbeats then serves
	// the calls it can, instead of a queue of calls that all time out.
	// Below it the Keeper keeps a bound of its own that follows the
	// store's round trips (see adapt), starting at StartCalls.
	MaxCalls int
	Prefix   string // the package's name, for messages
	Renewal  string // what a renewal is called in messages ("renewal", "heartbeat")
	Calls    string // what the store's calls are called ("statements", "DynamoDB calls")
	Store    string // the store's name in messages ("database", "DynamoDB")
	Events   Events
	// The package's sentinels.
	Closed, Released, LockLost, NotAcquired error
}

// Keeper is a Client's core: it registers the calls and goroutines its
// Close waits for, holds the Client's locks, and runs one renewal loop
// for all of them (started with the first lock). Safe for concurrent use.
type Keeper struct {
	cfg    Config
	be     Backend
	log    *slog.Logger
	events *notify.Queue
	retry  backoff.Policy // delays after failed renewals

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu       sync.Mutex
	closed   bool
	held     map[*Hold]struct{} // not yet released: Close releases them
	live     map[*Hold]struct{} // not yet ended: the loop renews them
	looping  bool
	calls    int            // renewal calls in flight; the loop's own
	window   float64        // the bound on calls in flight below MaxCalls; the loop's own
	shrunk   time.Time      // when window last shrank; the loop's own
	wg       sync.WaitGroup // calls, the loop, renewals, background releases
	nudge    chan struct{}
	results  chan results
	loopDone chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// results are a renewal call's answers; cut says the call reached its
// time bound.
type results struct {
	c   *call
	hs  []*Hold
	rs  []Renewed
	cut bool
}

// NewKeeper returns the core of a Client with cfg (already checked).
func NewKeeper(cfg Config, be Backend) *Keeper {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hb := cfg.Heartbeat
	ctx, cancel := context.WithCancel(context.Background())
	return &Keeper{
		cfg: cfg, be: be, log: log, events: notify.New(cfg.Observer, 1024),
		retry: backoff.Policy{Base: max(hb/8, time.Millisecond), Cap: max(hb/2, time.Millisecond)},
		ctx:   ctx, cancel: cancel,
		held: make(map[*Hold]struct{}), live: make(map[*Hold]struct{}),
		nudge: make(chan struct{}, 1), results: make(chan results), loopDone: make(chan struct{}),
		window: float64(min(StartCalls, max(cfg.MaxCalls, 1))),
	}
}

// Log returns the Client's logger (never nil).
func (k *Keeper) Log() *slog.Logger { return k.log }

// Begin starts the Acquire (try false) or TryAcquire of key: it returns
// the context the call goes on with and the Span that Keeper.Acquire (or
// NotAcquired, for a call refused before) ends.
func (k *Keeper) Begin(ctx context.Context, key string, try bool) (context.Context, observed.Span) {
	name := k.cfg.Events.Acquire
	if try {
		name = k.cfg.Events.TryAcquire
	}
	return observed.Start(k.cfg.Observer, ctx, observe.Call{Name: name, Key: key})
}

// NotAcquired ends sp, an acquisition of key refused before it began,
// with err.
func (k *Keeper) NotAcquired(sp observed.Span, key string, err error) {
	sp.End(observe.Event{Name: k.cfg.Events.NotAcquired, Key: key, Err: err})
}

// Closing reports whether Close has begun.
func (k *Keeper) Closing() bool { return k.ctx.Err() != nil }

// Enter registers a call that Close must wait for; Leave ends it.
func (k *Keeper) Enter() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return k.cfg.Closed
	}
	k.wg.Add(1)
	return nil
}

// Leave ends a call registered by Enter.
func (k *Keeper) Leave() { k.wg.Done() }

// Go runs f in a goroutine that Close waits for, even once closed.
func (k *Keeper) Go(f func()) {
	k.mu.Lock()
	k.wg.Add(1)
	k.mu.Unlock()
	go func() {
		defer k.wg.Done()
		f()
	}()
}

// Add registers h (its Ref set) for renewal. If the Keeper was closed
// meanwhile, it releases h instead (waiting at most a lease) and returns
// Config.Closed. A lock whose acquiring call was answered with less than
// a heartbeat of its lease left (a slow store, or a process paused as
// the answer came) is renewed first, before Add returns (see refresh),
// unless its maximum hold has passed.
func (k *Keeper) Add(h *Hold) error {
	if now := k.cfg.Now(); k.ctx.Err() == nil && h.valid.Sub(now) < k.cfg.Heartbeat && (h.maxAt.IsZero() || now.Before(h.maxAt)) {
		k.refresh(h)
	}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		h.finish(k.cfg.Released, nil)
		ctx, cancel := context.WithTimeout(context.Background(), k.cfg.Lease)
		defer cancel()
		h.releaseOnce(ctx)
		return k.cfg.Closed
	}
	k.held[h] = struct{}{}
	if h.Err() == nil { // not ended by refresh
		k.live[h] = struct{}{}
	}
	if !k.looping {
		k.looping = true
		k.wg.Add(1)
		go k.run()
	}
	k.mu.Unlock()
	select {
	case k.nudge <- struct{}{}:
	default:
	}
	return nil
}

// refresh renews h once, waiting at most a lease, before Add hands it to
// its caller and the loop: a store that answered the acquiring call late
// does not cost the lock at once. A renewal conditional on the lock's own
// write (its RVN, its token) that applies proves that no one took the
// lock meanwhile, and the caller has not had it yet, so the lock is valid
// from the renewal's send, as after any renewal. If it fails, the lock
// keeps the validity of its acquiring call and its loss says why; a loss
// the renewal found ends it.
func (k *Keeper) refresh(h *Hold) {
	ctx, cancel := context.WithTimeout(k.ctx, k.cfg.Lease)
	defer cancel()
	sent := k.cfg.Now()
	r := k.be.Renew(ctx, []*Hold{h})[0]
	now := k.cfg.Now()
	var loss *Loss
	switch {
	case errors.As(r.Err, &loss):
		h.end(loss)
	case r.Err != nil:
		h.failures = 1
		h.last = errfmt.Errorf("%s: the acquiring call was answered %v after it was sent, with less than a %s of its lease left, and the %s sent then failed: %w",
			k.cfg.Prefix, sent.Sub(h.start).Round(time.Millisecond), k.cfg.Renewal, k.cfg.Renewal, r.Err)
		h.event(k.cfg.Events.RenewFailed, now.Sub(sent), r.Err)
	default:
		h.extend(r.Valid)
		h.next = r.At.Add(k.cfg.Heartbeat)
		h.event(k.cfg.Events.Renewed, now.Sub(r.At), nil)
	}
}

// unrenew takes an ended lock out of the loop's set.
func (k *Keeper) unrenew(h *Hold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.live, h)
}

// forget takes a released lock out of the Client's set.
func (k *Keeper) forget(h *Hold) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.held, h)
	delete(k.live, h)
}

// Close releases every lock still held (each as by Hold.Close), makes
// blocked acquisitions end with Config.Closed, and waits for every call
// and goroutine, then runs after (the package's own waits). It is
// idempotent; every call returns the first one's result: the releases
// that failed for another reason than a lost lock.
func (k *Keeper) Close(after func()) error {
	k.closeOnce.Do(func() {
		k.mu.Lock()
		k.closed = true
		hs := make([]*Hold, 0, len(k.held))
		for h := range k.held {
			hs = append(hs, h)
		}
		k.mu.Unlock()
		k.cancel()
		errs := make([]error, len(hs))
		var wg sync.WaitGroup
		for i, h := range hs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := h.shut(); err != nil && !errors.Is(err, k.cfg.LockLost) {
					errs[i] = err
				}
			}()
		}
		wg.Wait()
		k.wg.Wait()
		if after != nil {
			after()
		}
		k.events.Close()
		k.closeErr = errors.Join(errs...)
	})
	return k.closeErr
}

// hung returns the error to report for h's expiry at now: the last
// renewal's, and whether one was still on the wire (c: the store, or the
// way to it, hangs) or, due, waited for one of the calls in flight to
// answer, so that the loss does not read like a paused process.
func (k *Keeper) hung(h *Hold, c *call, now time.Time) error {
	var err error
	switch {
	case c != nil:
		err = errfmt.Errorf("%s: a %s sent %v before the lease ran out had no answer: %w",
			k.cfg.Prefix, k.cfg.Renewal, now.Sub(c.at).Round(time.Millisecond), context.DeadlineExceeded)
	case h.held:
		err = errfmt.Errorf("%s: a %s due %v before the lease ran out waited for one of the %d in flight to answer: %w",
			k.cfg.Prefix, k.cfg.Renewal, now.Sub(h.next).Round(time.Millisecond), int(k.window), context.DeadlineExceeded)
	default:
		return h.last
	}
	if h.last != nil {
		err = errfmt.Errorf("%w (the %s before it failed: %w)", err, k.cfg.Renewal, h.last)
	}
	return err
}
