package dynamoconditional

import (
	"context"
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Option configures this package's constructors: NewStock, NewAccounts,
// NewHolds and NewFenced take it, as in package conditional. Each setter
// applies to some of them, and a constructor given one that does not
// apply to it returns ErrInvalid naming the setter, before any I/O:
//
//   - WithObserver: every constructor
//   - WithKeyAttributes: NewStock, NewAccounts and NewHolds
//   - WithLogger: NewStock and NewHolds
//   - WithBuckets, WithCoalescing, WithMaxBatch: NewStock
//   - WithClock: NewHolds
//
// A nil Option is ErrInvalid too.
type Option func(*config)

// The setters each constructor takes (see Option).
var (
	stockSetters    = []string{"WithObserver", "WithKeyAttributes", "WithLogger", "WithBuckets", "WithCoalescing", "WithMaxBatch"}
	accountsSetters = []string{"WithObserver", "WithKeyAttributes"}
	holdsSetters    = []string{"WithObserver", "WithKeyAttributes", "WithLogger", "WithClock"}
	fencedSetters   = []string{"WithObserver"}
)

// config is the settings Options make; each constructor reads its own.
type config struct {
	used     option.Used
	keys     keyAttrs
	log      *slog.Logger
	obs      observe.Observer
	buckets  int
	coalesce bool
	maxBatch int
	clock    func() time.Time
}

// setter returns the Option named name that applies set.
func setter(name string, set func(*config)) Option {
	return func(c *config) { c.used.Add(name); set(c) }
}

// apply applies opts to cfg, refusing a nil one or one that ctor, which
// takes allowed, does not take.
func apply(cfg *config, opts []Option, ctor string, allowed []string) error {
	return condcore.Options(option.ApplyTo(cfg, &cfg.used, opts, ctor, allowed))
}

// WithLogger logs the retries of writes that met concurrent ones to l
// (nil, the default, discards): each retry at Debug ("conditional:
// conflict; retrying": key, attempt, delay, err), and running out of
// attempts at Warn ("conditional: gave up": key, attempts, err, the last
// attempt's). A Stock retries a take across buckets whose buckets
// changed under it; Holds a write that met a transaction in progress on
// its item (key: the resource; for HoldAll, the resources joined by ",").
// l is called on the calling goroutine.
func WithLogger(l *slog.Logger) Option { return setter("WithLogger", func(c *config) { c.log = l }) }

// retrier retries a write with jittered backoff, logging as WithLogger
// says.
type retrier struct {
	policy backoff.Policy
	log    *slog.Logger // never nil
}

func newRetrier(log *slog.Logger) retrier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return retrier{policy: backoff.Policy{Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond, Attempts: backoff.DefaultAttempts}, log: log}
}

// retry runs op, and again while retryable says so, within the policy's
// attempts; its error is the policy's (wrapping backoff.ErrExhausted when the
// attempts ran out).
func (r retrier) retry(ctx context.Context, key string, op func(context.Context) error, retryable func(error) bool) error {
	var onRetry func(int, error, time.Duration)
	if r.log.Enabled(ctx, slog.LevelDebug) {
		onRetry = func(attempt int, err error, d time.Duration) {
			r.log.LogAttrs(ctx, slog.LevelDebug, "conditional: conflict; retrying",
				slog.String("key", key), slog.Int("attempt", attempt), slog.Duration("delay", d), slog.Any("err", err))
		}
	}
	err := r.policy.Retry(ctx, func(ctx context.Context, _ int) error { return op(ctx) }, retryable, onRetry)
	if last, ok := backoff.Last(err); ok {
		r.log.LogAttrs(ctx, slog.LevelWarn, "conditional: gave up", slog.String("key", key), slog.Int("attempts", r.policy.Attempts), slog.Any("err", last))
	}
	return err
}
