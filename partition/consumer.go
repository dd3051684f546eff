package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkadial"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/internal/seam"
	"github.com/nolock/nolock/observe"
)

// Handler applies one batch of one partition's messages, in offset order,
// inside the fenced transaction tx: whatever it writes through tx commits
// together with the partition's next offset, or not at all. It must not
// commit or roll back tx, and must not write through other connections
// what it wants fenced.
//
// tx is the pgx.Tx that the DB's Begin returned, as is: a Handler may
// type-assert its own Tx type (a DB of yours that wraps transactions for
// metrics or tracing). One exception keeps a Handler's statements working
// behind PgBouncer before 1.21: once nolock has learnt that the
// connection's endpoint does not keep named prepared statements (pgx's
// default cache_statement mode there, see docs/deploying.md), tx is
// nolock's wrapper of that transaction, which sends the Handler's
// statements unnamed. With any other query exec mode tx is always the
// DB's own. Return a statement's error wrapped (%w), so nolock can learn
// from it.
//
// ctx carries the Claim (FromContext) and ends after the batch timeout
// (WithBatchTimeout). A returned error rolls the batch back; a batch of
// several messages is then tried again one message at a time, and a
// message that keeps failing, or fails with a Permanent error, is parked
// (see WithAttempts). So a Handler may run more than once for
// a message, and only a committed run counts; effects outside tx are not
// fenced.
//
// A Handler is called concurrently for different partitions, and one batch
// at a time for each.
type Handler func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error

// DB is what a Consumer needs from PostgreSQL: transactions, concurrently.
// A *pgxpool.Pool fits; size it for one connection per partition this
// member may own, plus one. It may grow in later versions. Per handle:
//
//   - A pool: each partition's worker begins its batches' transactions on
//     a connection of its own, concurrently with the others.
//   - A *pgx.Conn is refused (ErrInvalid): the workers of the partitions
//     this member owns run their transactions concurrently, and a commit
//     whose wait ended runs on after its worker moved on, while a
//     connection runs one statement at a time.
//   - A pgx.Tx is refused (ErrInvalid): each batch's transaction must
//     commit on its own, with its epoch check and offset, before the
//     batch's Kafka offsets are committed; inside yours nothing would be
//     durable when they are.
//
// A wrapper of yours that New cannot see through (for metrics or tracing)
// is taken as is: its Begin must be safe for concurrent use and begin a
// transaction that commits on its own, as a pool's does.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Consumer is one member of a Kafka consumer group whose partitions are
// applied to PostgreSQL with epoch fencing. Run it in each process that
// consumes; Kafka spreads the partitions over the members, and the fence
// keeps a member that lost a partition from writing to it.
//
// Guarantee: for each (group, topic, partition), the batches that commit
// carry consecutive offsets from the stored one, each exactly once and in
// order, as long as every writer of the partition goes through this
// package and nobody deletes the partitions table's rows. It holds under
// pauses, crashes, rebalances, lost commits and group resets.
//
// A Consumer's methods are safe for concurrent use; Run may be called once.
// A commit whose wait ended first (BatchTimeout, or a caller's ctx) runs on
// to its end on a goroutine of the Consumer, at most
// pgoutcome.CommitTimeout; Close waits for those.
type Consumer struct {
	db          DB
	pg          *pgerr.Committer // its writes; Close waits for their commits
	cfg         config
	handler     Handler // Run's
	sql         statements
	parked      kafkapark.Store
	idleTimeout string // BatchTimeout in ms, for set_config
	log         *slog.Logger
	retry       backoff.Policy
	kafka       *kafka.Client
	transport   *kafka.Transport
	stats       statsTable

	running atomic.Bool // Run was called
	inRun   atomic.Bool // Run has not returned yet
	fatal   struct {
		once sync.Once
		err  error
	}

	// beforeBatch is called with each batch before each attempt's
	// transaction begins, holding nothing: a test (export_test.go) or
	// nolock's demo (internal/seam, through Run's ctx) blocks in it to
	// play an owner paused between reading a batch and writing it. No
	// user can set it.
	beforeBatch func(Claim, []kafka.Message)
}

// New returns a Consumer of topics for the consumer group group, through
// the Kafka bootstrap addresses brokers (host:port), applying to db. group
// is also part of the key of the partitions table, so two groups never
// share an epoch or an offset; each topic's partitions get their own
// worker, epoch and stored offset. New judges every argument and option
// (ErrInvalid names the bad one) and does no I/O: create the tables with
// CreateSchema, or put Schema in your migrations, before Run.
func New(db DB, brokers []string, group string, topics []string, opts ...Option) (*Consumer, error) {
	if pgarg.NilDB(db) {
		return nil, invalid("db is nil")
	}
	if h := pgarg.Single(db); h != "" {
		return nil, invalid("db is %s: the partitions' workers run transactions concurrently, each committing on its own; pass a *pgxpool.Pool", h)
	}
	cfg, err := newConfig(brokers, group, topics, opts)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tr := kafkadial.Transport(cfg.Dialer)
	return &Consumer{
		db:          db,
		pg:          new(pgerr.Committer),
		cfg:         cfg,
		sql:         newStatements(cfg.Table),
		parked:      kafkapark.NewStore(cfg.Table + parkedSuffix),
		idleTimeout: strconv.FormatInt(cfg.BatchTimeout.Milliseconds(), 10),
		log:         log.With("group", cfg.GroupID),
		retry:       cfg.Retry,
		kafka:       &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: tr, Timeout: cfg.SessionTimeout},
		transport:   tr,
	}, nil
}

// Close waits for the commits in flight whose waits ended first (each
// bounded by pgoutcome.CommitTimeout): Run's batches' and claims', and
// the parked-message calls'. Call it after Run has returned. It is
// idempotent and safe to call concurrently; a call after Close still
// works, its caller waiting for its commit. The database handle is the
// caller's to close.
func (c *Consumer) Close() error {
	c.pg.Close()
	return nil
}

// Schema returns the DDL (idempotent) of the Consumer's partitions and
// parked tables, for migration tools.
func (c *Consumer) Schema() string { return c.sql.schema }

// Schema returns the DDL (idempotent) of the partitions table named table
// and its parked table, as a Consumer WithTable(table) creates them, for
// migration tools; it needs no Consumer. A name WithTable would refuse is
// ErrInvalid.
func Schema(table string) (string, error) {
	if err := pgarg.Ident("table", table, len(parkedSuffix)); err != nil {
		return "", errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return newStatements(table).schema, nil
}

// CreateSchema creates the partitions and parked tables if they do not
// exist. It is safe to call from many processes at once: the DDL runs in
// one transaction that first takes a transaction-scoped advisory lock
// (pg_advisory_xact_lock, the same key for all of nolock's schemas).
func (c *Consumer) CreateSchema(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	if err := pgschema.CreateWith(ctx, c.db, c.sql.schema); err != nil {
		return errfmt.Errorf("partition: create schema: %w", err)
	}
	return nil
}

// ErrRunTwice is what Run returns when it was called on the Consumer
// before: a Consumer runs once; make a new one to run again.
var ErrRunTwice = errors.New("partition: Run called twice")

// Run joins the group and applies the partitions Kafka assigns to this
// member with h, batch by batch in fenced transactions, until ctx ends, then returns nil once every worker has stopped
// and the member has left the group. A worker stops at the end of its
// generation; a batch in flight then (or when ctx ends) is finished, within
// the batch timeout, rather than cut off. A message that fails its
// attempts is parked and its partition goes on (WithAttempts). Run
// returns an error only when it cannot go on: a message could not be
// parked (the parked table is missing, say), a stored offset Kafka no
// longer has (ErrOffsetLost), or Kafka refused with an error that does not
// pass (authorisation, the group's settings).
//
// Transient trouble is waited out inside Run, with backoff: Kafka or
// PostgreSQL being unreachable, rebalances (a rebalance in progress, an
// illegal generation, an unknown member), a coordinator or leader moving
// or loading, request timeouts, a claim that Kafka refused, a fenced
// worker. A Kafka error that does not pass (authorisation, invalid
// settings, unsupported version) ends Run with it.
// Run may be called once per Consumer: a second call returns ErrRunTwice.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	switch {
	case ctx == nil:
		return invalid("ctx is nil")
	case h == nil:
		return invalid("handler is nil")
	}
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	c.inRun.Store(true)
	defer c.inRun.Store(false)
	c.handler = h
	if f := seam.BeforeBatch(ctx); f != nil && c.beforeBatch == nil {
		c.beforeBatch = func(cl Claim, msgs []kafka.Message) { f(context.WithValue(ctx, claimKey{}, cl), msgs) }
	}
	defer c.transport.CloseIdleConnections()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                c.cfg.GroupID,
		Brokers:           c.cfg.Brokers,
		Dialer:            c.cfg.Dialer,
		Topics:            c.cfg.Topics,
		GroupBalancers:    c.cfg.GroupBalancers,
		HeartbeatInterval: c.cfg.HeartbeatInterval,
		SessionTimeout:    c.cfg.SessionTimeout,
		RebalanceTimeout:  c.cfg.RebalanceTimeout,
		JoinGroupBackoff:  c.cfg.JoinGroupBackoff,
		StartOffset:       c.cfg.StartOffset,
		// A member that sees the partition count change ends the
		// generation; the group rejoins and assigns the new partitions.
		WatchPartitionChanges:  true,
		PartitionWatchInterval: c.cfg.PartitionWatchInterval,
		Logger:                 kafkaLogger(c.log, slog.LevelDebug),
		ErrorLogger:            kafkaLogger(c.log, slog.LevelWarn),
	})
	if err != nil {
		return errfmt.Errorf("%w: kafka-go consumer group: %v", ErrInvalid, err)
	}
	var workers sync.WaitGroup
	failures := 0
	for ctx.Err() == nil {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !kafkaerr.Retriable(err) {
				c.fail(errfmt.Errorf("partition: join group %s: %w", c.cfg.GroupID, err))
				break
			}
			failures++
			c.log.Warn("partition: next generation failed, retrying", "attempt", failures, "err", err)
			if backoff.Sleep(ctx, c.retry.Delay(min(failures+1, 30))) != nil {
				break
			}
			continue
		}
		failures = 0
		c.log.Info("partition: generation", "generation", gen.ID, "member", gen.MemberID, "assignments", gen.Assignments)
		for _, topic := range c.cfg.Topics {
			for _, pa := range gen.Assignments[topic] {
				a := assignment{topic: topic, partition: pa.ID, generation: gen.ID, member: gen.MemberID, offset: pa.Offset}
				workers.Add(1)
				// kafka-go ends the generation as soon as any function
				// started here returns, and rejoins only after all did.
				gen.Start(func(genCtx context.Context) {
					defer workers.Done()
					if err := c.work(ctx, genCtx, gen, a); err != nil {
						c.fail(err)
						cancel()
					}
				})
			}
		}
	}
	cancel()
	_ = cg.Close() // ends the generation, waits for its workers, leaves the group
	workers.Wait() // and those kafka-go started after the generation had ended
	return c.fatal.err
}

// note reports e, named name (one of the Event constants), about cl's
// partition ("topic/partition", then "@offset" if offset >= 0) with cl's
// epoch, to the observer, if any, on the worker's goroutine.
func (c *Consumer) note(ctx context.Context, name string, cl Claim, offset int64, e observe.Event) {
	if c.cfg.Observer == nil {
		return
	}
	e.Name, e.Key, e.Token = name, kafkapark.EventKey(cl.Topic, cl.Partition, offset), cl.Epoch
	observed.Event(c.cfg.Observer, ctx, e)
}

// fail records the error that stops Run; the first one wins.
func (c *Consumer) fail(err error) {
	c.fatal.once.Do(func() { c.fatal.err = err })
}

// kafkaLogger sends kafka-go's printf-style logs to log at level.
func kafkaLogger(log *slog.Logger, level slog.Level) kafka.Logger {
	return kafka.LoggerFunc(func(msg string, args ...any) {
		if log.Enabled(context.Background(), level) {
			log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(msg, args...))
		}
	})
}

type claimKey struct{}

// FromContext returns the Claim under which a Handler runs, from the ctx
// it was given.
func FromContext(ctx context.Context) (Claim, bool) {
	if ctx == nil {
		return Claim{}, false
	}
	cl, ok := ctx.Value(claimKey{}).(Claim)
	return cl, ok
}
