package cas

import (
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/observe"
)

// The errors of this package, shared with package dynamocas: errors.Is
// matches them whichever backend returned them. Their doc is in
// internal/casstore.
var (
	ErrConflict        = casstore.ErrConflict        // another writer changed the value: nothing written
	ErrNotFound        = casstore.ErrNotFound        // no value under the key
	ErrExists          = casstore.ErrExists          // Create found a value under the key
	ErrInvalid         = casstore.ErrInvalid         // bad input, named in the text; nothing sent
	ErrTooLarge        = casstore.ErrTooLarge        // encoded value over the backend's limit; nothing sent
	ErrAmbiguousCommit = casstore.ErrAmbiguousCommit // sent, then the connection failed: may have applied
	ErrClosed          = casstore.ErrClosed          // the Store was closed before the update was sent
)

// Backend stores (key, value, version) records for a Store:
// PostgresBackend here, dynamocas.Backend on DynamoDB.
type Backend = casstore.Backend

// Codec turns values into bytes and back; JSON is the default.
type Codec[T any] = casstore.Codec[T]

// JSON is the default Codec.
type JSON[T any] = casstore.JSON[T]

// Versioned is a value with the version it was stored at.
type Versioned[T any] = casstore.Versioned[T]

// Store is a typed versioned store with compare-and-set updates, safe for
// concurrent use; Close it to stop its goroutines.
type Store[T any] = casstore.Store[T]

// MaxKeyLen bounds a Store key's length in bytes.
const MaxKeyLen = casstore.MaxKeyLen

// NewStore returns a Store of T values on b, encoded with codec (nil means
// JSON).
func NewStore[T any](b Backend, codec Codec[T], opts ...StoreOption) (*Store[T], error) {
	return casstore.NewStore(b, codec, opts...)
}

// Option configures both Retry and NewStore: the retry policy and its
// observers (WithBackoff, WithAttempts, WithOnRetry, WithStats,
// WithObserver, WithLogger).
type Option = casstore.Option

// StoreOption configures NewStore: an Option, or one for Stores only
// (WithCoalescing, WithMaxBatch).
type StoreOption = casstore.StoreOption

// RetryOption configures Retry: an Option. A Store-only option is not one,
// so passing it to Retry does not compile.
type RetryOption = casstore.RetryOption

// WithBackoff sets the jitter window of the first delayed retry and its
// ceiling, both positive, base at most cap (defaults 2 ms and 500 ms).
func WithBackoff(base, cap time.Duration) Option { return casstore.WithBackoff(base, cap) }

// DefaultAttempts bounds the attempts unless WithAttempts says otherwise.
const DefaultAttempts = casstore.DefaultAttempts // 10

// WithAttempts bounds the attempts, the first included: at least 1,
// default DefaultAttempts (10).
func WithAttempts(n int) Option { return casstore.WithAttempts(n) }

// WithOnRetry calls f before each retry's wait; f must be fast and safe for
// concurrent use.
func WithOnRetry(f func(key string, attempt int, err error, delay time.Duration)) Option {
	return casstore.WithOnRetry(f)
}

// WithStats counts attempts, conflicts and commits into s.
func WithStats(s *Stats) Option { return casstore.WithStats(s) }

// WithObserver reports "cas.conflict", "cas.retry", "cas.committed" and
// "cas.gave_up" to o (nil: none); docs/observability.md lists their fields.
func WithObserver(o observe.Observer) Option { return casstore.WithObserver(o) }

// WithLogger logs retries at Debug ("cas: conflict; retrying": key,
// attempt, delay, err), running out of attempts at Warn ("cas: gave up":
// key, attempts, err) and a write whose outcome is unknown at Warn ("cas:
// commit outcome unknown": key, err) to l; nil, the default, discards.
func WithLogger(l *slog.Logger) Option { return casstore.WithLogger(l) }

// WithCoalescing turns the coalescing (flat combining) of concurrent Updates of one key on
// (the default) or off for the whole Store.
func WithCoalescing(on bool) StoreOption { return casstore.WithCoalescing(on) }

// WithMaxBatch bounds how many Updates one combined write applies (default 128).
func WithMaxBatch(n int) StoreOption { return casstore.WithMaxBatch(n) }

// UpdateOption configures one Update call.
type UpdateOption = casstore.UpdateOption

// NoCoalescing runs this Update on its own read-modify-write, neither combined
// with nor queued behind others of the same key.
func NoCoalescing() UpdateOption { return casstore.NoCoalescing() }

// Stats counts what a Store or Retry did; safe for concurrent use.
type Stats = casstore.Stats

// StatsSnapshot is a copy of the counters at one moment.
type StatsSnapshot = casstore.StatsSnapshot
