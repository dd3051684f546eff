package idemrecord

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/backoff"
)

// Logger returns l, or, for nil, a logger that discards (its Enabled is
// false, so nothing is formatted).
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// LogOutcome logs a Do or Exec call's outcome on key, made within
// attempts, as both stores'
// WithLogger says: a replay and a mismatch (the client's error) at Debug,
// a wait for a concurrent duplicate that ran out at Info, and at Warn
// attempts that ran out (backoff.ErrExhausted) and an ambiguous
// commit. A run that committed, and any other error, the caller's, are not
// logged.
func LogOutcome(ctx context.Context, log *slog.Logger, key string, attempts int, replayed bool, err error) {
	if err == nil && !replayed {
		return
	}
	level, msg := slog.LevelDebug, "idempotency: replayed"
	last, exhausted := backoff.Last(err)
	switch {
	case err == nil:
	case errors.Is(err, ErrMismatch):
		msg = "idempotency: key reused with another request"
	case errors.Is(err, ErrInProgress):
		level, msg = slog.LevelInfo, "idempotency: duplicate still in progress"
	case exhausted:
		level, msg = slog.LevelWarn, "idempotency: gave up"
	case errors.Is(err, ErrAmbiguousCommit):
		level, msg = slog.LevelWarn, "idempotency: commit outcome unknown"
	default:
		return
	}
	switch {
	case !log.Enabled(ctx, level):
	case err == nil:
		log.LogAttrs(ctx, level, msg, slog.String("key", key))
	case exhausted:
		log.LogAttrs(ctx, level, msg, slog.String("key", key), slog.Int("attempts", attempts), slog.Any("err", last))
	default:
		log.LogAttrs(ctx, level, msg, slog.String("key", key), slog.Any("err", err))
	}
}

// RetryLogger returns what a retry loop on key calls before each retry's
// wait, to log it at Debug ("idempotency: conflict; retrying": key,
// attempt, delay, err); nil when log has Debug off.
func RetryLogger(ctx context.Context, log *slog.Logger, key string) func(attempt int, err error, delay time.Duration) {
	if !log.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	return func(attempt int, err error, delay time.Duration) {
		log.LogAttrs(ctx, slog.LevelDebug, "idempotency: conflict; retrying",
			slog.String("key", key), slog.Int("attempt", attempt), slog.Duration("delay", delay), slog.Any("err", err))
	}
}
