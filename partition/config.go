package partition

import (
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Defaults of the settings an Option changes. The group timings are
// kafka-go's. inbox has the same names, values and meanings for the
// batching, retry and timeout settings.
const (
	DefaultTable             = "nolock_partition"
	DefaultMaxBatch          = 100
	DefaultBatchWait         = 50 * time.Millisecond
	DefaultBatchTimeout      = 15 * time.Second
	DefaultBackoffBase       = 100 * time.Millisecond
	DefaultBackoffCap        = 5 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultSessionTimeout    = 30 * time.Second
	DefaultRebalanceTimeout  = 30 * time.Second
	DefaultJoinGroupBackoff  = 5 * time.Second
	DefaultAttempts          = 10
	// DefaultPartitionWatchInterval is kafka-go's.
	DefaultPartitionWatchInterval = 5 * time.Second
	// DefaultMinBytes and DefaultMaxBytes are kafka-go's Reader defaults.
	DefaultMinBytes = 1
	DefaultMaxBytes = 1_000_000
	DefaultMaxWait  = time.Second
)

// parkedSuffix names the parked messages' table: the table's name +
// "_parked".
const parkedSuffix = "_parked"

// ErrInvalid marks an argument or option that cannot work; the error's
// text names it. New returns it before any I/O.
var ErrInvalid = errors.New("partition: invalid argument")

// Option configures a Consumer, given to New: WithTable, WithMaxBatch,
// WithBatchWait, WithBatchTimeout, WithAttempts, WithBackoff,
// WithStartOffset, WithReadUncommitted, WithKafkaCommitInterval, the
// group's WithHeartbeatInterval, WithSessionTimeout, WithRebalanceTimeout,
// WithJoinGroupBackoff, WithPartitionWatchInterval, WithGroupBalancers,
// WithRackID, the fetches' WithMinBytes, WithMaxBytes, WithMaxWait,
// WithDialer, and WithLogger, WithObserver, WithOnClaim, WithOnRelease.
// New judges every option's value as given (an explicit value is never
// read as the default) and refuses one that cannot work with ErrInvalid
// naming it.
//
// The batching, retry and timeout settings have one meaning and one
// default in inbox and partition: WithMaxBatch (messages per transaction,
// 100), WithBatchWait (the wait for messages Kafka already reported,
// 50 ms), WithBatchTimeout (a batch's and a replay's transaction, 15 s;
// here at most half the rebalance timeout), WithAttempts (counted
// failures before a message is parked, 10) and WithBackoff (100 ms to
// 5 s, full jitter).
type Option func(*config)

// config is a Consumer's settings: New's arguments, then the defaults,
// then the options.
type config struct {
	Brokers, Topics []string
	GroupID         string
	Table           string

	MaxBatch     int
	BatchWait    time.Duration
	BatchTimeout time.Duration
	batchTimeout bool // set by WithBatchTimeout

	HeartbeatInterval, SessionTimeout, RebalanceTimeout, JoinGroupBackoff time.Duration

	StartOffset            int64
	MaxAttempts            int
	Retry                  backoff.Policy
	KafkaCommitInterval    time.Duration
	ReadUncommitted        bool
	PartitionWatchInterval time.Duration

	GroupBalancers []kafka.GroupBalancer
	balancers      bool // set by WithGroupBalancers
	RackID         string
	rack           bool // set by WithRackID

	MinBytes, MaxBytes int
	MaxWait            time.Duration

	Dialer   *kafka.Dialer
	Logger   *slog.Logger
	Observer observe.Observer

	OnClaim   func(Claim)
	OnRelease func(Claim, error)

	nilOption bool
}

// WithTable names the partitions table, one row per (group, topic,
// partition); default DefaultTable. Its parked messages' table is the
// name + "_parked". It is one identifier, found through the search_path,
// and always quoted. Never delete its rows: a deleted row restarts its
// epoch at 1 and unfences every old owner.
func WithTable(name string) Option { return func(c *config) { c.Table = name } }

// WithMaxBatch bounds the messages per Handler call, one transaction (at
// least 1; default DefaultMaxBatch, 100). A batch whose Handler fails is
// split and its messages applied one at a time, so only the failing
// message is retried and parked.
func WithMaxBatch(n int) Option { return func(c *config) { c.MaxBatch = n } }

// WithBatchWait bounds how long a batch waits for messages that Kafka
// already reported (below the high watermark) but that have not arrived
// yet; default DefaultBatchWait (50 ms), 0 hands a batch over with what
// arrived. Not negative. A batch
// never waits for messages that were not yet produced: it is handed over
// as soon as the partition's known backlog is read or the batch is full.
func WithBatchWait(d time.Duration) Option { return func(c *config) { c.BatchWait = d } }

// WithBatchTimeout bounds one batch's transaction, Handler included, and
// sets it as the transaction's idle_in_transaction_session_timeout, so
// PostgreSQL cuts off an owner frozen inside a transaction (which holds
// the partition's row lock and would stall the next owner's claim).
// A batch that times out in the Handler counts as a failed attempt.
// ReplayParked's transaction has the same bound. Default
// DefaultBatchTimeout (15 s), or half the rebalance timeout
// (WithRebalanceTimeout) if that is shorter; it must be at least 1 ms and
// below the rebalance timeout, because a member finishes its batches in
// flight before it rejoins a rebalance, and the coordinator drops a member
// that does not rejoin within the rebalance timeout.
func WithBatchTimeout(d time.Duration) Option {
	return func(c *config) { c.BatchTimeout, c.batchTimeout = d, true }
}

// WithHeartbeatInterval sets how often the member heartbeats to the
// group's coordinator: positive and below the session timeout (a third of
// it is the usual choice); default 3 s.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(c *config) { c.HeartbeatInterval = d }
}

// WithSessionTimeout sets after how long without a heartbeat the
// coordinator drops the member and moves its partitions: the handover
// time after a crash. Positive; default 30 s. The broker bounds it
// (group.min.session.timeout.ms, 6 s by default, and
// group.max.session.timeout.ms); outside its bounds Run returns the
// broker's error.
func WithSessionTimeout(d time.Duration) Option { return func(c *config) { c.SessionTimeout = d } }

// WithRebalanceTimeout sets how long the members have to rejoin a
// rebalance; the coordinator drops a member that takes longer. Positive;
// default 30 s.
func WithRebalanceTimeout(d time.Duration) Option {
	return func(c *config) { c.RebalanceTimeout = d }
}

// WithJoinGroupBackoff sets how long the member waits before it rejoins
// the group after an error. Positive; default 5 s.
func WithJoinGroupBackoff(d time.Duration) Option {
	return func(c *config) { c.JoinGroupBackoff = d }
}

// WithStartOffset says where a partition with no stored offset and no
// offset committed to Kafka by the group starts: kafka.FirstOffset
// (default) or kafka.LastOffset. Once a batch committed, the stored offset
// rules.
func WithStartOffset(offset int64) Option { return func(c *config) { c.StartOffset = offset } }

// WithAttempts bounds how often one message is tried on its own when it
// fails with an error that counts (typically the Handler's own, its
// timeout or panic); then it is parked: a row in the parked table commits
// in the same fenced transaction that moves the partition's stored offset
// past it, and the partition goes on with the next message. A batch of
// several messages that fails so is split at once and its messages
// applied one at a time, so only the failing message is parked. A
// Permanent error parks it on its first attempt alone. A serialization
// failure or deadlock (40001, 40P01), a lost connection or another
// database trouble raised in the Handler is not the message's fault: it is
// retried without counting, up to n times in a row; each one after that
// counts. The package's own statements' transient failures (and a commit
// whose outcome is unknown) are retried for as long as the generation
// lasts and never count. At least 1; default DefaultAttempts, 10; inbox's
// option means the same.
func WithAttempts(n int) Option { return func(c *config) { c.MaxAttempts = n } }

// WithKafkaCommitInterval also commits each partition's stored offset to
// Kafka, at most once per d per partition, for tools that read consumer
// lag from Kafka: after a batch once d is up, and the last batch's offset
// when the partition stays idle until d is up or its worker stops (best
// effort; a failed commit is logged at Debug). PostgreSQL stays the
// truth: the Kafka offset is read only when the partition's row holds
// none yet. Default 0: never.
func WithKafkaCommitInterval(d time.Duration) Option {
	return func(c *config) { c.KafkaCommitInterval = d }
}

// WithReadUncommitted(true) reads every record a producer wrote,
// including those of transactions still open or aborted. By default the
// partition is read committed: it is read only up to Kafka's last stable
// offset, so a record is applied only once its transaction committed, and
// a record of an aborted transaction is never applied. Either way Kafka's
// control records (the commit and abort markers of transactional
// producers) never reach the Handler, the parked event or the parked
// table. kafka-go's Reader hands over both aborted and control records,
// so each fetched range is fetched once more to classify its record
// batches (see docs/partition.md).
func WithReadUncommitted(on bool) Option { return func(c *config) { c.ReadUncommitted = on } }

// isolation is the isolation level of the partitions' fetches.
func (c config) isolation() kafka.IsolationLevel {
	if c.ReadUncommitted {
		return kafka.ReadUncommitted
	}
	return kafka.ReadCommitted
}

// WithPartitionWatchInterval sets how often each member asks Kafka how
// many partitions the topics have; when the count changed (partitions
// were added), the group rebalances and the new partitions are assigned
// and consumed from the start offset. Positive; default 5 s.
func WithPartitionWatchInterval(d time.Duration) Option {
	return func(c *config) { c.PartitionWatchInterval = d }
}

// WithGroupBalancers sets the assignment strategies this member offers
// the group, most preferred first; the group uses one that every member
// offers (Kafka's rule), so members of one group must share one. Default
// kafka-go's: kafka.RangeGroupBalancer, then kafka.RoundRobinGroupBalancer;
// with WithRackID, kafka.RackAffinityGroupBalancer{Rack: id} before them.
// The list must not be empty, hold nil, or offer one protocol name twice.
// Only the assignment depends on it: the fence makes any balancer safe.
func WithGroupBalancers(b ...kafka.GroupBalancer) Option {
	return func(c *config) {
		c.GroupBalancers, c.balancers = append([]kafka.GroupBalancer(nil), b...), true
	}
}

// WithRackID names the rack (availability zone) this member runs in, as
// the brokers' broker.rack does. kafka-go v0.4.51 fetches from partition
// leaders only (no KIP-392 follower fetching), so the rack steers the
// assignment: kafka.RackAffinityGroupBalancer gives each partition to a
// member in its leader's rack where there is one. Without
// WithGroupBalancers, that balancer is offered first; with it, id must be
// the Rack of a RackAffinityGroupBalancer in the list (New refuses a rack
// that would have no effect). Not empty.
func WithRackID(id string) Option { return func(c *config) { c.RackID, c.rack = id, true } }

// WithMinBytes, WithMaxBytes and WithMaxWait shape each fetch of a
// partition's reader: the broker answers once it holds the minimum for
// the fetch, or once the wait has passed, with at most about the maximum
// (a larger first record batch is still returned whole). A minimum above
// 1 trades latency (up to the wait per fetch) for fewer, larger fetches.
// The minimum must be at least 1 (default 1) and not above the maximum.
func WithMinBytes(n int) Option { return func(c *config) { c.MinBytes = n } }

// WithMaxBytes bounds each fetch's answer, about (see WithMinBytes): not
// above 1 GiB; default 1 MB.
func WithMaxBytes(n int) Option { return func(c *config) { c.MaxBytes = n } }

// WithMaxWait bounds how long the broker holds a fetch waiting for the
// minimum bytes (see WithMinBytes); default 1 s. kafka-go keeps part of it
// for the round trip: the broker holds a fetch for the wait less 1 s, or
// for three quarters of a wait below 1 s. Positive and below the
// rebalance timeout: a worker closes its reader, which waits for the
// fetch in flight, before its member rejoins a rebalance.
func WithMaxWait(d time.Duration) Option { return func(c *config) { c.MaxWait = d } }

// WithDialer opens every connection this package makes to Kafka with d
// and all of its settings: the consumer group's (finding the coordinator,
// joining, heartbeats, offset commits, the partition watch), each
// partition reader's (metadata, fetches), and those of the claims'
// DescribeGroups, the first-offset checks' ListOffsets and the
// classifying fetches, which go through a kafka.Transport built from the
// whole Dialer (see docs/partition.md for which field maps where).
// Default kafka.DefaultDialer; d must not be nil. New copies the Dialer
// (not what its pointer fields point to: TLS, SASLMechanism, Resolver).
func WithDialer(d *kafka.Dialer) Option {
	return func(c *config) {
		if d == nil {
			c.Dialer = nil
			c.nilOption = true
			return
		}
		cp := *d
		c.Dialer = &cp
	}
}

// WithBackoff sets the wait between attempts at a failing batch or
// message, and between tries of a claim, a fetch or a join that failed:
// full jitter from base up to cap (defaults DefaultBackoffBase, 100 ms,
// and DefaultBackoffCap, 5 s). Both must be positive, and base at most
// cap.
func WithBackoff(base, cap time.Duration) Option {
	return func(c *config) { c.Retry.Base, c.Retry.Cap = base, cap }
}

// WithLogger sends claims, releases, retries and kafka-go's own logs to
// l; nil (the default) discards them.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.Logger = l } }

// WithObserver reports each worker's claims, batches, retries, parked
// messages and releases to o (EventClaimed, EventCommitted, EventFailed,
// EventRetry, EventParked, EventFenced, EventReleased: their fields are
// in their docs), each batch as a call (CallHandle: Start, whose context
// the Handler gets, then End with EventCommitted or EventFailed), on the
// worker's goroutine, in order: o must be quick, a slow o delays the
// worker. nil (the default) reports nothing.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.Observer = observe.Guard(o) }
}

// WithOnClaim has f called by a worker after it claimed a partition and
// before it reads from it. It runs on the worker's goroutine, one call at
// a time per partition but concurrently across partitions, and must
// return quickly.
func WithOnClaim(f func(Claim)) Option { return func(c *config) { c.OnClaim = f } }

// WithOnRelease has f called when a worker stops: with nil when the
// generation ended or Run is stopping, ErrFenced (wrapped) when a newer
// owner took the partition, or the error that stops Run. It runs on the
// worker's goroutine, one call at a time per partition but concurrently
// across partitions, and must return quickly.
func WithOnRelease(f func(Claim, error)) Option { return func(c *config) { c.OnRelease = f } }

// newConfig applies the defaults, then opts, then the defaults that
// depend on other settings, and judges the result.
func newConfig(brokers []string, group string, topics []string, opts []Option) (config, error) {
	c := config{
		Brokers: append([]string(nil), brokers...), GroupID: group, Topics: append([]string(nil), topics...),
		Table: DefaultTable, MaxBatch: DefaultMaxBatch, BatchWait: DefaultBatchWait,
		HeartbeatInterval: DefaultHeartbeatInterval, SessionTimeout: DefaultSessionTimeout,
		RebalanceTimeout: DefaultRebalanceTimeout, JoinGroupBackoff: DefaultJoinGroupBackoff,
		StartOffset: kafka.FirstOffset, MaxAttempts: DefaultAttempts,
		Retry:                  backoff.Policy{Base: DefaultBackoffBase, Cap: DefaultBackoffCap},
		PartitionWatchInterval: DefaultPartitionWatchInterval,
		MinBytes:               DefaultMinBytes, MaxBytes: DefaultMaxBytes, MaxWait: DefaultMaxWait,
	}
	if err := option.Apply(opts, func(o Option) { o(&c) }); err != nil {
		return c, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if c.nilOption {
		return c, invalid("WithDialer(nil): give a Dialer, or leave the option out for kafka.DefaultDialer")
	}
	if !c.batchTimeout {
		c.BatchTimeout = min(DefaultBatchTimeout, c.RebalanceTimeout/2)
	}
	if !c.balancers {
		c.GroupBalancers = []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}}
		if c.RackID != "" {
			c.GroupBalancers = append([]kafka.GroupBalancer{kafka.RackAffinityGroupBalancer{Rack: c.RackID}}, c.GroupBalancers...)
		}
	}
	if c.Dialer == nil {
		d := *kafka.DefaultDialer
		c.Dialer = &d
	}
	return c, c.validate()
}
