package inbox

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/kafkadial"
	"github.com/nolock/nolock/internal/kafkatxn"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/pgarg"
)

// Reader is what Run needs from a *kafka.Reader configured with a GroupID.
// The inbox, not Kafka's offset, decides what ran: a redelivered message is
// skipped however far back the group's offset is.
type Reader interface {
	FetchMessage(ctx context.Context) (kafka.Message, error)
	CommitMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Run consumes r until ctx ends: it fetches messages and hands each
// partition's messages, in order, to that partition's own goroutine, which
// processes them through the inbox in batches of one transaction each
// (WithMaxBatch, WithBatchWait, WithBatchTimeout) and commits their Kafka
// offsets only after that transaction committed. So a
// partition waiting on a failing message does not hold up the others:
// Run keeps fetching, and every other partition's messages are applied
// meanwhile. Each partition buffers up to partitionBuffer (256) fetched
// messages, or twice the batch size if larger; only when a stalled
// partition's buffer is full does fetching wait for it.
//
// A message whose handler fails is retried on its own with backoff
// (WithBackoff); its attempts are counted outside the failing transaction,
// and after WithAttempts (at once for a Permanent error or a message
// without identity) it is parked and its partition moves on. A message
// without identity is logged at Error, the first of a row; when ten of
// one partition's messages in a row lack one (a producer that does not
// set the header, or the wrong WithIdentity), Run stops before handling
// the tenth and returns an error wrapping ErrNoID that names the identity
// and that message's position, so a misconfiguration parks at most nine
// messages per partition and Run, not the topic. Skipped duplicates are
// logged at Info once per batch, with their number; Stats counts them. Errors
// reaching the database are retried with backoff. Retriable Kafka errors
// from r (a rebalance in progress, a coordinator or leader moving or
// loading, a timeout, a lost connection to a broker) are logged and
// retried with the same backoff. Run returns nil when ctx ends, after the
// attempt in flight of each partition ended (each within the batch
// timeout; nothing is retried after ctx ended); messages fetched but not
// applied are left for redelivery. It returns an
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
// worked on; on a single *pgx.Conn, Run processes one batch at a time. On
// an Inbox made on a pgx.Tx, Run returns ErrInvalid at once: it commits
// Kafka offsets after each batch, which would then be durable before the
// batch is.
func (in *Inbox) Run(ctx context.Context, r Reader, h Handler) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	switch {
	case nilReader(r):
		return invalid("reader is nil")
	case h == nil:
		return invalid("handler is nil")
	case pgarg.Single(in.db) == "a pgx.Tx":
		return invalid("db is a pgx.Tx: Run commits Kafka offsets that your rollback would not take back; make the Inbox on a pool, or call Process in your transaction")
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// An attempt in flight outlives runCtx, bounded by the batch timeout
	// (see Process). Events go to the observer through Run's own queue, so
	// that an observer never runs on a partition's goroutine, which may
	// hold the lock that serialises batches on a single connection; only
	// a handler's call (Start, End) runs where the handler runs.
	events := notify.New(in.obs, 1024)
	defer events.Close() // after every partition's goroutine has stopped
	work := context.WithValue(context.WithoutCancel(ctx), queueKey{}, events)

	p := &partitions{in: in, r: r, h: recovering(h), run: runCtx, stop: stopRun, work: work, queues: map[topicPartition]chan kafka.Message{}}
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
	}
	in.running.start(p, newReaderInfo(r))
	defer in.running.stop(p)
	err := p.dispatch()
	stopRun()
	p.wg.Wait()
	if p.fatal.err != nil {
		return p.fatal.err
	}
	return err
}

// nilReader reports whether r is nil or a nil *kafka.Reader, whose methods
// would panic.
func nilReader(r Reader) bool {
	kr, ok := r.(*kafka.Reader)
	return r == nil || ok && kr == nil
}
