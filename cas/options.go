package cas

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Option configures NewStore, Retry and pgcas.Retry: the retry policy,
// its observers and a Store's coalescing. Each setter applies to some of
// them, and a call given one that does not apply to it returns ErrInvalid
// naming the setter, before any I/O:
//
//   - WithBackoff, WithAttempts, WithObserver, WithLogger: NewStore, Retry
//     and pgcas.Retry
//   - WithCoalescing, WithMaxBatch: NewStore
//
// A nil Option is ErrInvalid too. One Update's own settings are an
// UpdateOption.
type Option func(*config)

// The setters of Option, one bit each, and their names in bit order.
const (
	setBackoff option.Used = 1 << iota
	setAttempts
	setObserver
	setLogger
	setCoalescing
	setMaxBatch
)

var setterNames = []string{"WithBackoff", "WithAttempts", "WithObserver", "WithLogger", "WithCoalescing", "WithMaxBatch"}

// The setters each constructor takes (see Option).
const (
	retrySetters = setBackoff | setAttempts | setObserver | setLogger
	storeSetters = retrySetters | setCoalescing | setMaxBatch
)

// config is the settings Options make: the retry policy, the observers and
// the Store's combining. Retry runs its attempts through it.
type config struct {
	used    option.Used
	policy  backoff.Policy
	combine bool
	max     int
	obs     observe.Observer // guarded: calls' Start and End, and Retry's events
	events  *notify.Queue    // a Store's, nil for Retry: its writes' events
	log     *slog.Logger     // never nil: discard unless WithLogger
}

// event reports e: a Store's through its queue, Retry's on the calling
// goroutine.
func (c *config) event(ctx context.Context, e observe.Event) {
	if c.events != nil {
		c.events.Notify(ctx, e)
		return
	}
	observed.Event(c.obs, ctx, e)
}

// DefaultAttempts bounds the attempts unless WithAttempts says otherwise.
const DefaultAttempts = 10

// newRetryConfig applies opts to the defaults and validates the result;
// an invalid setting, or a nil option, is an ErrInvalid naming it.
func newRetryConfig(opts []Option) (config, error) { return newConfig(opts, "Retry", retrySetters) }

// newStoreConfig is newRetryConfig for NewStore's options.
func newStoreConfig(opts []Option) (config, error) { return newConfig(opts, "NewStore", storeSetters) }

// newConfig applies opts to the defaults, refuses a setter that ctor
// (which takes allowed) does not take, and validates the result.
func newConfig(opts []Option, ctor string, allowed option.Used) (config, error) {
	c := defaults()
	if err := option.ApplyTo(&c, &c.used, opts, setterNames, ctor, allowed); err != nil {
		return c, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return c.validate()
}

func defaults() config {
	return config{
		policy:  backoff.Policy{Base: backoff.DefaultBase, Cap: backoff.DefaultCap, Attempts: DefaultAttempts, Immediate: casstore.LostRace},
		combine: true, max: 128, log: discard,
	}
}

func (c config) validate() (config, error) {
	if err := c.policy.Validate(); err != nil {
		return c, errfmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch {
	case c.policy.Base <= 0 || c.policy.Cap <= 0:
		return c, casstore.Invalid("WithBackoff base %v and cap %v must be positive", c.policy.Base, c.policy.Cap)
	case c.policy.Attempts < 1:
		return c, casstore.Invalid("WithAttempts(%d): below 1", c.policy.Attempts)
	case c.max < 1:
		return c, casstore.Invalid("WithMaxBatch(%d): below 1", c.max)
	}
	return c, nil
}

// WithBackoff sets the jitter window of the first delayed retry (base) and
// its ceiling (cap), both positive, base at most cap. Defaults: 2 ms and
// 500 ms. A lost compare-and-set is
// retried at once the first time; every other retry, and every retry of a
// serialization failure or deadlock, waits a uniform random time in
// [0, min(cap, base·2^k)] (full jitter), k counting from 0.
func WithBackoff(base, cap time.Duration) Option {
	return func(c *config) { c.used.Add(setBackoff); c.policy.Base, c.policy.Cap = base, cap }
}

// WithAttempts bounds the attempts, the first included: at least 1,
// default DefaultAttempts (10).
func WithAttempts(n int) Option {
	return func(c *config) { c.used.Add(setAttempts); c.policy.Attempts = n }
}

// WithObserver reports the package's events (EventConflict, EventRetry,
// EventCommitted, EventGaveUp, EventUpdated, EventFailed: their fields
// are in their docs) to o (nil: none): count them to find hot keys and
// measure contention. Each Retry and Update is a call (CallRetry,
// CallUpdate): o's Start, whose context op gets, and End with its
// outcome, on the calling goroutine, as are Retry's events; a Store's
// writes' events go to o from a goroutine of the Store's own, in order
// (a key's coalesced writes run on its drainer, which o must never hold
// up), and Close returns once o has had them all (see package observe).
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.used.Add(setObserver); c.obs = observe.Guard(o) }
}

// WithLogger logs to l (nil, the default, discards): each retry at Debug
// ("cas: conflict; retrying": key, attempt, delay, err), giving up at
// Warn ("cas: gave up": key, attempts, err, the last conflict) and a
// write whose outcome is unknown at Warn ("cas: commit outcome unknown":
// key, err). key is empty for Retry. It logs on the goroutine that makes
// the attempts, never with a lock of the Store held.
func WithLogger(l *slog.Logger) Option {
	if l == nil {
		l = discard
	}
	return func(c *config) { c.used.Add(setLogger); c.log = l }
}

// discard is the logger of a config without WithLogger: its Enabled is
// false, so nothing is formatted.
var discard = slog.New(slog.DiscardHandler)

// logRetry logs a retry at Debug, building nothing when Debug is off.
func (c *config) logRetry(ctx context.Context, key string, attempt int, d time.Duration, err error) {
	if c.log.Enabled(ctx, slog.LevelDebug) {
		c.log.LogAttrs(ctx, slog.LevelDebug, "cas: conflict; retrying",
			slog.String("key", key), slog.Int("attempt", attempt), slog.Duration("delay", d), slog.Any("err", err))
	}
}

// gaveUp reports (EventGaveUp, unless the call's End reports it: Retry's)
// and logs at Warn that the attempts on key ran out, err the last one's
// error: a Retry's or an Update's attempts, or a Store's batches stopped
// by callers that left.
func (c *config) gaveUp(ctx context.Context, key string, attempts int, err error, ends bool) {
	if !ends {
		c.event(ctx, observe.Event{Name: EventGaveUp, Key: key, Attempt: attempts, Err: err})
	}
	c.log.LogAttrs(ctx, slog.LevelWarn, "cas: gave up", slog.String("key", key), slog.Int("attempts", attempts), slog.Any("err", err))
}

// WithCoalescing turns the coalescing (flat combining) of concurrent Updates of one key on
// (the default) or off for the whole Store. Off, the Store still admits one
// read-modify-write per key at a time in this process (the others wait
// their turn instead of conflicting); conflicts then come only from other
// processes. NoCoalescing takes one call out of both.
func WithCoalescing(on bool) Option {
	return func(c *config) { c.used.Add(setCoalescing); c.combine = on }
}

// WithMaxBatch bounds how many Updates one combined write applies (default 128).
func WithMaxBatch(n int) Option { return func(c *config) { c.used.Add(setMaxBatch); c.max = n } }

// committed records one successful write of n updates of key.
func (c *config) committed(ctx context.Context, key string, n int) {
	c.event(ctx, observe.Event{Name: EventCommitted, Key: key, N: int64(n)})
}

// retry runs op with the configured policy, retrying conflicts (see
// casstore.Conflict); key names the record in events and logs, empty for
// Retry, whose End reports giving up (ends).
func (c *config) retry(ctx context.Context, key string, op func(ctx context.Context) error, ends bool) error {
	err := c.policy.Retry(ctx, func(ctx context.Context, attempt int) error {
		err := op(ctx)
		if casstore.Conflict(err) {
			c.event(ctx, observe.Event{Name: EventConflict, Key: key, Attempt: attempt, Err: err})
		}
		return err
	}, casstore.Conflict, func(attempt int, err error, d time.Duration) {
		c.event(ctx, observe.Event{Name: EventRetry, Key: key, Attempt: attempt, Duration: d, Err: err})
		c.logRetry(ctx, key, attempt, d, err)
	})
	if err == nil {
		return nil
	}
	if last, ok := backoff.Last(err); ok {
		c.gaveUp(ctx, key, c.policy.Attempts, last, ends)
		return errfmt.Errorf("cas: %w", err)
	}
	if errors.Is(err, ErrAmbiguousCommit) {
		c.log.LogAttrs(ctx, slog.LevelWarn, "cas: commit outcome unknown", slog.String("key", key), slog.Any("err", err))
	}
	return err
}
