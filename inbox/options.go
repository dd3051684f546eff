package inbox

import (
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/observe"
)

// Defaults of the settings an Option changes. partition has the same
// names, values and meanings for the batching, retry and timeout settings.
const (
	DefaultTable        = "nolock_inbox"
	DefaultAttempts     = 10
	DefaultMaxBatch     = 100
	DefaultBatchWait    = 50 * time.Millisecond
	DefaultBatchTimeout = 15 * time.Second
	DefaultBackoffBase  = 100 * time.Millisecond
	DefaultBackoffCap   = 5 * time.Second
)

// Option configures an Inbox, given to New: WithIdentity, WithTable,
// WithMaxBatch, WithBatchWait, WithBatchTimeout, WithAttempts,
// WithBackoff, WithLogger, WithObserver. New judges every value as given
// (an explicit value is never read as the default) and refuses one that
// cannot work with ErrInvalid naming it.
//
// The batching, retry and timeout settings have one meaning and one
// default in inbox and partition: WithMaxBatch (messages per transaction,
// 100), WithBatchWait (the wait for messages Kafka already reported,
// 50 ms), WithBatchTimeout (a batch's and a replay's transaction, 15 s),
// WithAttempts (counted failures before a message is parked, 10) and
// WithBackoff (100 ms to 5 s, full jitter).
type Option func(*settings)

// settings is an Inbox's configuration: the defaults, then the options.
type settings struct {
	identity     Identity
	table        string
	maxBatch     int
	batchWait    time.Duration
	batchTimeout time.Duration
	attempts     int
	retry        backoff.Policy
	log          *slog.Logger
	obs          observe.Observer
}

func defaults() settings {
	return settings{
		identity: ByHeader("id"), table: DefaultTable, maxBatch: DefaultMaxBatch,
		batchWait: DefaultBatchWait, batchTimeout: DefaultBatchTimeout, attempts: DefaultAttempts,
		retry: backoff.Policy{Base: DefaultBackoffBase, Cap: DefaultBackoffCap},
	}
}

// WithIdentity sets how messages are recognised (default ByHeader("id")).
func WithIdentity(id Identity) Option { return func(s *settings) { s.identity = id } }

// WithTable names the inbox's table (default DefaultTable); its other
// tables and index are named after it: name_watermarks, name_attempts,
// name_parked and the index name_processed_at. Names are quoted, never
// interpolated raw. The name must be 1 to 50 bytes of UTF-8 without NUL,
// so that every name fits PostgreSQL's 63 bytes; New refuses any other.
func WithTable(name string) Option { return func(s *settings) { s.table = name } }

// WithMaxBatch bounds the messages of one partition that Run applies per
// transaction (at least 1; default DefaultMaxBatch, 100). A batch whose
// handler fails is split and its messages applied one at a time, so only
// the failing message is retried and parked.
func WithMaxBatch(n int) Option { return func(s *settings) { s.maxBatch = n } }

// WithBatchWait bounds how long a batch waits for messages that Kafka
// already reported (below the high-water mark the Reader gave with the
// last message) but that have not arrived yet; default DefaultBatchWait
// (50 ms), 0 hands a batch over with what arrived. A batch never waits
// for messages that were not yet produced: it is handed over as soon as
// the partition's known backlog is read or the batch is full. Not
// negative.
func WithBatchWait(d time.Duration) Option { return func(s *settings) { s.batchWait = d } }

// WithBatchTimeout bounds one batch's transaction, handler included, in
// Process, Run and ReplayParked: the handler's ctx ends then and the
// transaction rolls back. It is also set as the transaction's
// idle_in_transaction_session_timeout, so PostgreSQL ends the session of a
// handler stalled outside a statement (releasing the connection and the
// row locks its transaction holds); not when the DB is a pgx.Tx, whose
// transaction is the caller's. A batch that times out counts as a
// failed attempt. Default DefaultBatchTimeout (15 s); at least 1 ms,
// PostgreSQL's resolution. When Run's ctx ends, the attempt in flight of
// each partition finishes within it; nothing is retried after.
func WithBatchTimeout(d time.Duration) Option { return func(s *settings) { s.batchTimeout = d } }

// WithAttempts parks a message after n failed attempts that count (at
// least 1; default DefaultAttempts, 10): the handler's own errors, its
// timeout, its panic. A Permanent error, or a message without identity,
// is parked at once. A serialization failure or deadlock (40001, 40P01),
// a lost connection or another database trouble raised in the handler is
// not the message's fault: it is retried without counting, up to n times
// in a row; each one after that counts, so a message that causes it every
// time is still parked. A batch of several whose handler fails so is
// split at once (Database trouble: once it counts). partition's option
// means the same.
func WithAttempts(n int) Option { return func(s *settings) { s.attempts = n } }

// WithBackoff sets the wait between attempts at a failing batch or
// message, an unreachable database or a failing fetch: full jitter from
// base up to cap (defaults DefaultBackoffBase, 100 ms, and
// DefaultBackoffCap, 5 s). Both must be positive, and base at most cap.
func WithBackoff(base, cap time.Duration) Option {
	return func(s *settings) { s.retry.Base, s.retry.Cap = base, cap }
}

// WithLogger logs retries and parked messages to l; nil (the default)
// discards them.
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.log = l } }

// WithObserver reports what Process and Run do to o (EventCommitted,
// EventDuplicate, EventRetry, EventParked: their fields are in their
// docs): Process's on the goroutine that called it, Run's on a goroutine
// of Run's own, in order, so a slow observer never delays a batch. Each
// run of the handler on a message is a call (CallHandle: Start, whose
// context the handler gets, then End with EventHandled or
// EventHandleFailed), reported on the goroutine that runs the handler.
// nil (the default) reports nothing.
func WithObserver(o observe.Observer) Option { return func(s *settings) { s.obs = observe.Guard(o) } }

// validate reports the first setting that cannot work.
func (s settings) validate() error {
	switch {
	case s.identity.bad != "":
		return invalid("%s", s.identity.bad)
	case s.identity.id == nil && !s.identity.watermark:
		return invalid("identity is empty: use ByHeader, ByFunc, ByOffset or ByWatermark")
	case s.attempts < 1:
		return invalid("WithAttempts(%d): below 1", s.attempts)
	case s.maxBatch < 1:
		return invalid("WithMaxBatch(%d): below 1", s.maxBatch)
	case s.batchWait < 0:
		return invalid("WithBatchWait(%v): negative", s.batchWait)
	case s.batchTimeout < time.Millisecond:
		return invalid("WithBatchTimeout(%v): below 1ms, PostgreSQL's idle_in_transaction_session_timeout resolution", s.batchTimeout)
	case s.retry.Base <= 0 || s.retry.Cap <= 0:
		return invalid("WithBackoff(%v, %v): not positive", s.retry.Base, s.retry.Cap)
	}
	if err := s.retry.Validate(); err != nil {
		return invalid("WithBackoff: %v", err)
	}
	return nil
}
