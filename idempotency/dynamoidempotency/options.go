package dynamoidempotency

import (
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Defaults for New.
const (
	DefaultRetention = idemrecord.DefaultRetention // 24 h
	DefaultWait      = idemrecord.DefaultWait      // 5 s
	// MaxWait bounds WithWait, as it does for package idempotency.
	MaxWait = idemrecord.MaxWait
	// MaxRetention bounds WithRetention: 100 years.
	MaxRetention = idemrecord.MaxRetention
)

// Option configures New: WithKeyAttributes, WithRetention, WithWait,
// WithClock, WithObserver, WithLogger. Package idempotency has its own, so
// an option of one store given to the other is a compile error.
type Option func(*config)

type config struct {
	retention time.Duration
	wait      time.Duration
	pk, sk    string
	now       func() time.Time
	log       *slog.Logger
	obs       observe.Observer
}

// WithRetention sets how long a record counts after its key is claimed
// (default 24 h), judged by the writer's clock: after that the key is
// treated as unused. Each record keeps the expiry it was written with, so
// Stores with different retentions may share a table. At most
// MaxRetention.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithWait bounds the retries of a transaction that meets concurrent ones
// with the same key (default 5 s) before Do returns ErrInProgress. 0 means
// until the context ends.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// SortKeyValue is every record's sort key value on a table with a sort
// key (WithKeyAttributes), so a Store can share a table with other items.
const SortKeyValue = "nolock-idem"

// WithKeyAttributes names the table's partition key attribute (default
// "pk") and its sort key attribute ("" for none, the default; with one,
// records use the sort key value SortKeyValue).
func WithKeyAttributes(partition, sort string) Option {
	return func(c *config) { c.pk, c.sk = partition, sort }
}

// WithClock sets the clock that judges expiry (default time.Now): DynamoDB
// conditions have no server time.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithLogger logs to l (nil, the default, discards), on the calling
// goroutine: a replay ("idempotency: replayed") and a key reused with
// another request at Debug, a transaction retried after it met a
// concurrent one ("idempotency: conflict; retrying": attempt, delay, err)
// at Debug, the wait for a concurrent duplicate running out
// ("idempotency: duplicate still in progress") at Info, and an ambiguous
// commit ("idempotency: commit outcome unknown") at Warn, each with key.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithObserver reports each Do call to o (nil, the default: none), on
// the calling goroutine, as idempotency.Store does (CallDo: Start, whose
// context fn gets, then End with the outcome, after its transaction): EventRan, EventReplayed, EventMismatch,
// EventInProgress or EventFailed, whose docs say their fields. There is
// no Reap, so no idempotency.EventReaped.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.obs = observe.Guard(o) }
}

func newConfig(opts []Option) (config, error) {
	cfg := config{retention: DefaultRetention, wait: DefaultWait, pk: "pk", now: time.Now}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return cfg, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return cfg, idemrecord.ValidTiming(cfg.retention, cfg.wait)
}
