package dynamoconditional

import (
	"context"
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/backoff"
)

// WithLogger logs the retries of writes that met concurrent ones to l
// (nil, the default, discards): each retry at Debug ("conditional:
// conflict; retrying": key, attempt, delay, err), and running out of
// attempts at Warn ("conditional: gave up": key, attempts, err, the last
// attempt's). A Stock retries a take across buckets whose buckets
// changed under it; Holds a write that met a transaction in progress on
// its item (key: the resource; for HoldAll, the resources joined by ",").
// l is called on the calling goroutine.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.used.Add(setLogger); c.log = l } }

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
