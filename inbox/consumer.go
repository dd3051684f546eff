package inbox

import (
	"context"
	"sync"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/kafkadial"
	"github.com/nolock/nolock/internal/kafkatxn"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/option"
)

// Reader is what Run needs from a *kafka.Reader configured with a GroupID.
// The inbox, not Kafka's offset, decides what ran: a redelivered message is
// skipped however far back the group's offset is.
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// RunOption configures Run.
type RunOption func(*runConfig)

type runConfig struct {
	batch    int
	linger   time.Duration
	shutdown time.Duration
	retry    backoff.Policy
}

// WithMaxBatch processes up to n messages of one partition per
// transaction (at least 1; default 1: a transaction per message). Larger
// batches commit less often; a failing message is then retried on its own
// so the others are not held back. partition's option has the same name.
func WithMaxBatch(n int) RunOption { return func(c *runConfig) { c.batch = n } }

// WithBatchWait bounds how long a batch waits for more messages after its
// first (default 0: it takes what has arrived). Not negative. Unlike
// partition, which knows its partition's lag and waits only for messages
// already produced, the wait here is for any message: it trades latency
// on a quiet topic for fuller batches.
func WithBatchWait(d time.Duration) RunOption { return func(c *runConfig) { c.linger = d } }

// WithShutdownTimeout bounds how long Run keeps working on the batch in
// flight after its context ends (default 10 s). Past it, the batch's
// transaction is rolled back and its messages are left for redelivery.
func WithShutdownTimeout(d time.Duration) RunOption { return func(c *runConfig) { c.shutdown = d } }

// WithBackoff sets the wait between attempts at a failing message or an
// unreachable database: full jitter from base up to cap (defaults 100 ms
// and 5 s), as cas's option of the same name. Both must be positive, and
// base at most cap.
func WithBackoff(base, cap time.Duration) RunOption {
	return func(c *runConfig) { c.retry.Base, c.retry.Cap = base, cap }
}

// Run consumes r until ctx ends: it fetches messages and hands each
// partition's messages, in order, to that partition's own goroutine, which
// processes them through the inbox in batches of one transaction each and
// commits their Kafka offsets only after that transaction committed. So a
// partition waiting on a failing message does not hold up the others:
// Run keeps fetching, and every other partition's messages are applied
// meanwhile. Each partition buffers up to partitionBuffer (256) fetched
// messages, or twice the batch size if larger; only when a stalled
// partition's buffer is full does fetching wait for it.
//
// A message whose handler fails is retried on its own with backoff; its
// attempts are counted outside the failing transaction, and after the
// Inbox's max attempts (at once for a Permanent error or a message without
// identity) it is parked and its partition moves on. Errors reaching the
// database are retried with backoff. Retriable Kafka errors from r (a
// rebalance in progress, a coordinator or leader moving or loading, a
// timeout, a lost connection to a broker) are logged and retried with the
// same backoff. Run returns nil when ctx ends, after finishing (or, past
// the shutdown timeout, abandoning) the batches in flight; messages
// fetched but not yet started are left for redelivery. It returns an
// error only for bad input or when r fails for a reason that does not
// pass (r was closed, authorisation or configuration refused).
//
// When r has a Config() kafka.ReaderConfig method (a *kafka.Reader does),
// Run applies committed data only: Kafka's control records (transaction
// markers) and records of aborted transactions never reach h or the parked
// table, and a record of a transaction still open waits until it ends.
// kafka-go's Reader hands both over, so Run fetches each range once more
// to tell (see docs/inbox.md); configure the Reader with IsolationLevel
// kafka.ReadCommitted so it does not wait. Skipped messages' offsets are
// committed with their batch.
//
// The partitions' transactions run concurrently, so the Inbox's DB should
// be a pool (a *pgxpool.Pool) with a connection per partition being
// worked on; on a single *pgx.Conn or a pgx.Tx, Run processes one batch
// at a time.
func (in *Inbox) Run(ctx context.Context, r Reader, h Handler, opts ...RunOption) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	cfg := runConfig{batch: 1, shutdown: 10 * time.Second, retry: backoff.Policy{Base: 100 * time.Millisecond, Cap: 5 * time.Second}}
	if err := option.Apply(opts, func(o RunOption) { o(&cfg) }); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case nilReader(r):
		return invalid("reader is nil")
	case h == nil:
		return invalid("handler is nil")
	case cfg.batch < 1:
		return invalid("WithMaxBatch(%d): below 1", cfg.batch)
	case cfg.linger < 0:
		return invalid("WithBatchWait(%v): negative", cfg.linger)
	case cfg.shutdown < 0:
		return invalid("WithShutdownTimeout(%v): negative", cfg.shutdown)
	case cfg.retry.Base <= 0 || cfg.retry.Cap <= 0:
		return invalid("WithBackoff(%v, %v): not positive", cfg.retry.Base, cfg.retry.Cap)
	}
	if err := cfg.retry.Validate(); err != nil {
		return errfmt.Errorf("%w: %v", ErrInvalid, err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Batches in flight outlive runCtx by at most the shutdown timeout.
	// Their events go to the observer through Run's own queue, so that an
	// observer never runs on a partition's goroutine, which may hold the
	// lock that serialises batches on a single connection.
	events := notify.New(in.obs, 1024)
	defer events.Close() // after every partition's goroutine has stopped
	work, cancelWork := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), queueKey{}, events))
	defer cancelWork()
	stopTimer := context.AfterFunc(runCtx, func() {
		t := time.AfterFunc(cfg.shutdown, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopTimer()

	p := &partitions{in: in, r: r, h: recovering(h), cfg: cfg, run: runCtx, work: work, queues: map[topicPartition]chan kafka.Message{}}
	if kr, ok := r.(interface{ Config() kafka.ReaderConfig }); ok {
		rc := kr.Config()
		d := rc.Dialer
		if d == nil {
			d = kafka.DefaultDialer
		}
		tr := kafkadial.Transport(d)
		defer tr.CloseIdleConnections()
		p.filter = func(topic string, partition int) *kafkatxn.Filter {
			return kafkatxn.New(tr, kafka.TCP(rc.Brokers...), topic, partition, true)
		}
	}
	if _, ok := in.db.(*pgx.Conn); ok {
		p.serial = new(sync.Mutex)
	} else if _, ok := in.db.(pgx.Tx); ok {
		p.serial = new(sync.Mutex)
	}
	err := p.dispatch()
	stopRun()
	p.wg.Wait()
	return err
}

// nilReader reports whether r is nil or a nil *kafka.Reader, whose methods
// would panic.
func nilReader(r Reader) bool {
	kr, ok := r.(*kafka.Reader)
	return r == nil || ok && kr == nil
}
