package partition

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/pgarg"
)

// Defaults for zero fields of a Config. The group timings are kafka-go's.
const (
	DefaultTable             = "nolock_partition"
	DefaultMaxBatch          = 100
	DefaultBatchWait         = 50 * time.Millisecond
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultSessionTimeout    = 30 * time.Second
	DefaultRebalanceTimeout  = 30 * time.Second
	DefaultJoinGroupBackoff  = 5 * time.Second
	DefaultMaxAttempts       = 10
	// DefaultPartitionWatchInterval is kafka-go's.
	DefaultPartitionWatchInterval = 5 * time.Second
	// DefaultMinBytes and DefaultMaxBytes are kafka-go's Reader defaults.
	DefaultMinBytes = 1
	DefaultMaxBytes = 1_000_000
	DefaultMaxWait  = time.Second
)

// parkedSuffix names the parked messages' table: Table + "_parked".
const parkedSuffix = "_parked"

// ErrInvalid marks a Config that cannot work; the error's text names the
// field. New returns it before any I/O.
var ErrInvalid = errors.New("partition: invalid config")

// Config says what to consume and how. Brokers, GroupID, Topics and Handler
// are required; every other zero field means its default. A Config is a
// value: New copies it, and later changes have no effect.
type Config struct {
	// Brokers are Kafka bootstrap addresses (host:port).
	Brokers []string
	// GroupID is the Kafka consumer group. It is also part of the key of
	// the partitions table, so two groups never share an epoch or an offset.
	GroupID string
	// Topics are consumed together by the group; each of their partitions
	// gets its own worker, epoch and stored offset.
	Topics []string
	// Handler applies a batch inside the fenced transaction.
	Handler Handler

	// Table is the partitions table, one row per (group, topic,
	// partition); default DefaultTable. It is one identifier, found through
	// the search_path, and always quoted. Never delete its rows: a deleted
	// row restarts its epoch at 1 and unfences every old owner.
	Table string

	// MaxBatch bounds the messages per Handler call; default 100.
	MaxBatch int
	// BatchWait bounds how long a batch waits for messages that Kafka
	// already reported (below the high watermark) but that have not
	// arrived yet; default 50 ms. A batch never waits for messages that
	// were not yet produced: it is handed over as soon as the partition's
	// known backlog is read or MaxBatch is reached.
	BatchWait time.Duration
	// BatchTimeout bounds one batch's transaction, Handler included, and is
	// also set as the transaction's idle_in_transaction_session_timeout, so
	// PostgreSQL cuts off an owner frozen inside a transaction (which holds
	// the partition's row lock and would stall the next owner's claim).
	// Default RebalanceTimeout/2; it must be below RebalanceTimeout, because
	// a member finishes its batches in flight before it rejoins a
	// rebalance, and the coordinator drops a member that does not rejoin
	// within RebalanceTimeout.
	BatchTimeout time.Duration

	// HeartbeatInterval, SessionTimeout, RebalanceTimeout and
	// JoinGroupBackoff are kafka-go's consumer group settings (defaults
	// 3 s, 30 s, 30 s, 5 s). HeartbeatInterval must be below SessionTimeout
	// (a third of it is the usual choice). The broker bounds SessionTimeout
	// (group.min.session.timeout.ms, 6 s by default, and
	// group.max.session.timeout.ms); outside its bounds Run returns the
	// broker's error. A member that stops heartbeating loses its partitions
	// after SessionTimeout; that is the handover time after a crash.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration

	// StartOffset is where a partition with no stored offset and no offset
	// committed to Kafka by the group starts: kafka.FirstOffset (default)
	// or kafka.LastOffset. Once a batch committed, the stored offset rules.
	StartOffset int64

	// MaxAttempts bounds how often one message is tried on its own when it
	// fails with an error that is not transient (typically the Handler's
	// own); then it is parked: a row in the parked table (Table +
	// "_parked") commits in the same fenced transaction that moves the
	// partition's stored offset past it, and the partition goes on with the
	// next message. A batch of several messages that fails so is split at
	// once and its messages applied one at a time, so only the failing
	// message is parked. Transient errors (lost connections, serialization
	// failures, deadlocks, a commit whose outcome is unknown) are retried
	// for as long as the generation lasts and never count. Default 10.
	MaxAttempts int

	// KafkaCommitInterval, if positive, also commits each partition's
	// stored offset to Kafka, at most this often per partition, for tools
	// that read consumer lag from Kafka: after a batch once the interval
	// is up, and the last batch's offset when the partition stays idle
	// until the interval is up or its worker stops (best effort; a failed
	// commit is logged at Debug). PostgreSQL stays the truth: the Kafka
	// offset is read only when the partition's row holds none yet.
	// Default 0: never.
	KafkaCommitInterval time.Duration

	// ReadUncommitted, if true, reads every record a producer wrote,
	// including those of transactions still open or aborted. By default
	// (false) the partition is read committed: it is read only up to
	// Kafka's last stable offset, so a record is applied only once its
	// transaction committed, and a record of an aborted transaction is
	// never applied. Either way Kafka's control records (the commit and
	// abort markers of transactional producers) never reach the Handler,
	// OnPark or the parked table. kafka-go's Reader hands over both aborted
	// and control records, so each fetched range is fetched once more to
	// classify its record batches (see docs/partition.md).
	ReadUncommitted bool

	// PartitionWatchInterval is how often each member asks Kafka how many
	// partitions the Topics have; when the count changed (partitions were
	// added), the group rebalances and the new partitions are assigned and
	// consumed from StartOffset. Default 5 s; it must not be negative.
	PartitionWatchInterval time.Duration

	// GroupBalancers are the assignment strategies this member offers
	// the group, most preferred first; the group uses one that every
	// member offers (Kafka's rule), so members of one group must share
	// one. Default kafka-go's: kafka.RangeGroupBalancer, then
	// kafka.RoundRobinGroupBalancer; with RackID set,
	// kafka.RackAffinityGroupBalancer{Rack: RackID} before them. An
	// explicit list must not be empty, hold nil, or offer one protocol
	// name twice. Only the assignment depends on it: the fence makes any
	// balancer safe.
	GroupBalancers []kafka.GroupBalancer
	// RackID names the rack (availability zone) this member runs in, as
	// the brokers' broker.rack does. kafka-go v0.4.51 fetches from
	// partition leaders only (no KIP-392 follower fetching), so the rack
	// steers the assignment: kafka.RackAffinityGroupBalancer gives each
	// partition to a member in its leader's rack where there is one. With
	// GroupBalancers nil, that balancer is offered first; with an explicit
	// list, RackID must be the Rack of a RackAffinityGroupBalancer in it
	// (Validate refuses a RackID that would have no effect). Default "":
	// no rack.
	RackID string

	// MinBytes, MaxBytes and MaxWait shape each fetch of a partition's
	// reader: the broker answers once it holds MinBytes for the fetch, or
	// once MaxWait has passed, with at most about MaxBytes (a larger first
	// record batch is still returned whole). Defaults: 1 byte, 1 MB and
	// 1 s. kafka-go keeps part of MaxWait for the round trip: the broker
	// holds a fetch for MaxWait less 1 s, or for three quarters of a
	// MaxWait below 1 s. A MinBytes above 1 trades latency (up to MaxWait
	// per fetch) for fewer, larger fetches. None may be negative, MinBytes
	// must not be above MaxBytes, MaxBytes not above 1 GiB, and MaxWait
	// must be below RebalanceTimeout: a worker closes its reader, which
	// waits for the fetch in flight, before its member rejoins a rebalance.
	MinBytes int
	MaxBytes int
	MaxWait  time.Duration

	// Dialer opens every connection this package makes to Kafka, with all
	// of its settings: the consumer group's (finding the coordinator,
	// joining, heartbeats, offset commits, the partition watch), each
	// partition reader's (metadata, fetches), and those of the claims'
	// DescribeGroups, the first-offset checks' ListOffsets and the
	// classifying fetches, which go through a kafka.Transport built from
	// the whole Dialer (see docs/partition.md for which field maps where).
	// nil means kafka.DefaultDialer. New copies the Dialer (not what its
	// pointer fields point to: TLS, SASLMechanism, Resolver).
	Dialer *kafka.Dialer
	// Logger receives claims, releases, retries and kafka-go's own logs;
	// nil discards them.
	Logger *slog.Logger

	// OnClaim, if set, is called by a worker after it claimed a partition
	// and before it reads from it. OnRelease, if set, is called when the
	// worker stops: with nil when the generation ended or Run is stopping,
	// ErrFenced (wrapped) when a newer owner took the partition, or the
	// error that stops Run. Both run on the worker's goroutine, one call at
	// a time per partition but concurrently across partitions; they must
	// return quickly.
	OnClaim   func(Claim)
	OnRelease func(Claim, error)
	// OnPark, if set, is called after a message was parked (its row
	// committed), with the error of its last attempt; once per parked
	// message by the worker that parked it. It runs on the worker's
	// goroutine, concurrently across partitions, and must return quickly.
	OnPark func(msg kafka.Message, err error)
	// BeforeBatch, if set, is called by a worker with each batch it is
	// about to apply, before each attempt's transaction begins: the worker
	// then holds no transaction and no lock. It runs on the worker's
	// goroutine, concurrently across partitions. Blocking in it plays an
	// owner that stalls between reading a batch and writing it (a GC
	// pause, a frozen VM): when it returns, the attempt begins with a
	// fresh BatchTimeout, and if a newer owner claimed the partition
	// meanwhile, the fence refuses the attempt with ErrFenced and the
	// worker stops. Meant for tests, demonstrations and tracing; a
	// production Handler needs none.
	BeforeBatch func(Claim, []kafka.Message)
}

// DefaultConfig returns a Config with every default filled in; set
// Brokers, GroupID, Topics and Handler before passing it to New.
func DefaultConfig() Config { return Config{}.withDefaults() }

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.BatchWait == 0 {
		c.BatchWait = DefaultBatchWait
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.JoinGroupBackoff == 0 {
		c.JoinGroupBackoff = DefaultJoinGroupBackoff
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = c.RebalanceTimeout / 2
	}
	if c.StartOffset == 0 {
		c.StartOffset = kafka.FirstOffset
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.PartitionWatchInterval == 0 {
		c.PartitionWatchInterval = DefaultPartitionWatchInterval
	}
	if c.GroupBalancers == nil {
		c.GroupBalancers = []kafka.GroupBalancer{kafka.RangeGroupBalancer{}, kafka.RoundRobinGroupBalancer{}}
		if c.RackID != "" {
			c.GroupBalancers = append([]kafka.GroupBalancer{kafka.RackAffinityGroupBalancer{Rack: c.RackID}}, c.GroupBalancers...)
		}
	}
	if c.MinBytes == 0 {
		c.MinBytes = DefaultMinBytes
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	return c
}

// Validate reports the first setting that cannot work, naming it, as
// ErrInvalid. Zero fields are judged by their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case len(c.Brokers) == 0:
		return invalid("Brokers is empty")
	case c.GroupID == "":
		return invalid("GroupID is empty")
	case strings.IndexByte(c.GroupID, 0) >= 0 || !utf8.ValidString(c.GroupID):
		return invalid("GroupID %q is not UTF-8 without NUL", c.GroupID)
	case len(c.Topics) == 0:
		return invalid("Topics is empty")
	case c.Handler == nil:
		return invalid("Handler is nil")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return invalid("Brokers contains an empty address")
		}
	}
	seen := make(map[string]bool, len(c.Topics))
	for _, t := range c.Topics {
		switch {
		case t == "":
			return invalid("Topics contains an empty name")
		case seen[t]:
			return invalid("Topics names %q twice", t)
		}
		seen[t] = true
	}
	if err := pgarg.Ident("Table", c.Table, len(parkedSuffix)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case c.MaxBatch < 0:
		return invalid("MaxBatch %d is negative", c.MaxBatch)
	case c.MaxAttempts < 0:
		return invalid("MaxAttempts %d is negative", c.MaxAttempts)
	case c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return invalid("StartOffset %d is neither kafka.FirstOffset nor kafka.LastOffset", c.StartOffset)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"BatchWait", c.BatchWait}, {"BatchTimeout", c.BatchTimeout},
		{"HeartbeatInterval", c.HeartbeatInterval}, {"SessionTimeout", c.SessionTimeout},
		{"RebalanceTimeout", c.RebalanceTimeout}, {"JoinGroupBackoff", c.JoinGroupBackoff},
		{"KafkaCommitInterval", c.KafkaCommitInterval}, {"PartitionWatchInterval", c.PartitionWatchInterval},
		{"MaxWait", c.MaxWait},
	} {
		if d.v < 0 {
			return invalid("%s %v is negative", d.name, d.v)
		}
	}
	switch {
	case c.HeartbeatInterval >= c.SessionTimeout:
		return invalid("HeartbeatInterval %v is not below SessionTimeout %v", c.HeartbeatInterval, c.SessionTimeout)
	case c.BatchTimeout >= c.RebalanceTimeout:
		return invalid("BatchTimeout %v is not below RebalanceTimeout %v: a member finishes its batch before it rejoins, and the coordinator drops members that take longer than RebalanceTimeout", c.BatchTimeout, c.RebalanceTimeout)
	case c.BatchTimeout < time.Millisecond:
		return invalid("BatchTimeout %v is below 1ms, PostgreSQL's idle_in_transaction_session_timeout resolution", c.BatchTimeout)
	}
	return c.validateKafka()
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
