package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkatxn"
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

// WithBatch processes up to n messages of one partition per transaction,
// waiting at most linger for more after the first (default 1: a
// transaction per message). Larger batches commit less often; a failing
// message is then retried on its own so the others are not held back.
func WithBatch(n int, linger time.Duration) RunOption {
	return func(c *runConfig) { c.batch, c.linger = n, linger }
}

// WithShutdownTimeout bounds how long Run keeps working on the batch in
// flight after its context ends (default 10 s). Past it, the batch's
// transaction is rolled back and its messages are left for redelivery.
func WithShutdownTimeout(d time.Duration) RunOption { return func(c *runConfig) { c.shutdown = d } }

// WithRetryBackoff sets the wait between attempts at a failing message or
// an unreachable database: full jitter from base up to cap (defaults 100 ms
// and 5 s).
func WithRetryBackoff(base, cap time.Duration) RunOption {
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
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case r == nil:
		return invalid("reader is nil")
	case h == nil:
		return invalid("handler is nil")
	case cfg.batch < 1:
		return invalid("batch %d is below 1", cfg.batch)
	case cfg.linger < 0 || cfg.shutdown < 0:
		return invalid("linger %v and shutdown timeout %v must not be negative", cfg.linger, cfg.shutdown)
	}
	if err := cfg.retry.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// Batches in flight outlive runCtx by at most the shutdown timeout.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(runCtx, func() {
		t := time.AfterFunc(cfg.shutdown, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopTimer()

	p := &partitions{in: in, r: r, h: recovering(h), cfg: cfg, run: runCtx, work: work, queues: map[topicPartition]chan kafka.Message{}}
	if kr, ok := r.(interface{ Config() kafka.ReaderConfig }); ok {
		rc := kr.Config()
		tr := &kafka.Transport{}
		if d := rc.Dialer; d != nil {
			tr.Dial, tr.TLS, tr.SASL, tr.ClientID = d.DialFunc, d.TLS, d.SASLMechanism, d.ClientID
		}
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

// partitionBuffer is how many fetched messages a partition holds before
// fetching waits for it (or twice the batch size, if larger).
const partitionBuffer = 256

type topicPartition struct {
	topic     string
	partition int
}

// partitions is one Run: a fetch loop that hands messages to one goroutine
// per partition.
type partitions struct {
	in        *Inbox
	r         Reader
	h         Handler
	cfg       runConfig
	run, work context.Context
	serial    *sync.Mutex // one batch at a time, for a DB that is one connection

	queues map[topicPartition]chan kafka.Message
	wg     sync.WaitGroup

	// filter, if set, returns a partition's classifier of control
	// records and records of aborted transactions.
	filter func(topic string, partition int) *kafkatxn.Filter
}

// dispatch fetches until run ends or r fails for good, riding out
// retriable errors with backoff, and queues each message on its
// partition's goroutine (started on its first message). It returns nil
// when run ended.
func (p *partitions) dispatch() error {
	failures := 0
	for {
		m, err := p.r.FetchMessage(p.run)
		if p.run.Err() != nil {
			return nil
		}
		if err != nil {
			if !kafkaerr.Retriable(err) {
				return fmt.Errorf("inbox: fetch: %w", err)
			}
			failures++
			p.in.log.Warn("inbox: fetch failed; retrying", "attempt", failures, "err", err)
			if backoff.Sleep(p.run, p.cfg.retry.Delay(failures+1)) != nil {
				return nil
			}
			continue
		}
		failures = 0
		k := topicPartition{m.Topic, m.Partition}
		q, ok := p.queues[k]
		if !ok {
			q = make(chan kafka.Message, max(partitionBuffer, 2*p.cfg.batch))
			p.queues[k] = q
			p.wg.Add(1)
			go p.consume(q)
		}
		select {
		case q <- m:
		case <-p.run.Done():
			return nil
		}
	}
}

// consume processes one partition's messages in order, a batch per
// transaction, until run ends; then it finishes the batch in flight
// (within the shutdown timeout) and leaves the queued messages for
// redelivery.
func (p *partitions) consume(q <-chan kafka.Message) {
	defer p.wg.Done()
	var f *kafkatxn.Filter
	for {
		batch := p.take(q)
		if batch == nil {
			return
		}
		apply := batch
		if p.filter != nil {
			if f == nil {
				f = p.filter(batch[0].Topic, batch[0].Partition)
			}
			var ok bool
			if apply, ok = p.committed(f, batch); !ok {
				return
			}
		}
		if p.serial != nil && len(apply) > 0 {
			p.serial.Lock()
		}
		var err error
		if len(apply) > 0 {
			err = p.in.handle(p.work, apply, p.h, p.cfg.retry)
		}
		if err == nil {
			err = p.r.CommitMessages(p.work, batch...)
			if err != nil && p.run.Err() == nil {
				// The effects are recorded; a lost commit only means a
				// redelivery, which the inbox skips.
				p.in.log.Warn("inbox: offset commit failed", "err", err)
			}
		}
		if p.serial != nil && len(apply) > 0 {
			p.serial.Unlock()
		}
		if p.run.Err() != nil {
			return
		}
	}
}

// committed returns the messages of batch that are neither control records
// nor records of aborted transactions, waiting while a message's
// transaction is still open. Failures to tell are retried with backoff; it
// returns false once run ended, leaving batch for redelivery.
func (p *partitions) committed(f *kafkatxn.Filter, batch []kafka.Message) ([]kafka.Message, bool) {
	apply := batch[:0:0]
	for _, m := range batch {
		for attempt := 1; ; attempt++ {
			skip, err := f.Skip(p.run, m)
			if err == nil {
				if skip {
					p.in.log.Debug("inbox: skipped a control record or a record of an aborted transaction", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
				} else {
					apply = append(apply, m)
				}
				break
			}
			if p.run.Err() != nil {
				return nil, false
			}
			p.in.log.Warn("inbox: classifying a record failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
			if backoff.Sleep(p.run, p.cfg.retry.Delay(attempt+1)) != nil {
				return nil, false
			}
		}
	}
	return apply, true
}

// take waits for one message of q, then takes up to batch-1 more that are
// queued or arrive within linger. It returns nil once run ended.
func (p *partitions) take(q <-chan kafka.Message) []kafka.Message {
	var first kafka.Message
	select {
	case first = <-q:
	case <-p.run.Done():
		return nil
	}
	batch := []kafka.Message{first}
	if p.cfg.batch == 1 {
		return batch
	}
	linger := time.NewTimer(p.cfg.linger)
	defer linger.Stop()
	for len(batch) < p.cfg.batch {
		select {
		case m := <-q:
			batch = append(batch, m)
		case <-linger.C:
			return batch
		case <-p.run.Done():
			return batch
		}
	}
	return batch
}

// PanicError is a handler's panic that Run recovered: the message counts
// as failed (and is parked after the attempts), the process lives on.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("inbox: handler panicked: %v\n%s", e.Value, e.Stack)
}

// recovering turns a panic of h into a *PanicError, so that one poison
// message makes Run park it rather than crash the process on every
// redelivery.
func recovering(h Handler) Handler {
	return func(ctx context.Context, tx pgx.Tx, m kafka.Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		return h(ctx, tx, m)
	}
}

// handle processes batch in one transaction; when a handler fails, it
// processes the messages one by one so a poison message is isolated. Other
// failures (the database unreachable, a commit whose outcome is unknown)
// are retried with backoff: the inbox makes a retry of a batch that did
// commit a no-op.
func (in *Inbox) handle(ctx context.Context, batch []kafka.Message, h Handler, retry backoff.Policy) error {
	if len(batch) > 1 {
		isolate, err := in.processBatch(ctx, batch, h, retry)
		if err != nil || !isolate {
			return err
		}
	}
	for _, m := range batch {
		if err := in.handleOne(ctx, m, h, retry); err != nil {
			return err
		}
	}
	return nil
}

// processBatch retries batch as a whole until it commits, a handler fails
// (isolate: go one by one), or ctx ends.
func (in *Inbox) processBatch(ctx context.Context, batch []kafka.Message, h Handler, retry backoff.Policy) (isolate bool, err error) {
	for attempt := 1; ; attempt++ {
		_, err := in.Process(ctx, batch, h)
		var he *HandlerError
		switch {
		case err == nil:
			return false, nil
		case errors.As(err, &he) || errors.Is(err, ErrNoID):
			return true, nil
		}
		in.log.Warn("inbox: batch failed; retrying", "attempt", attempt, "err", err)
		if serr := backoff.Sleep(ctx, retry.Delay(attempt+1)); serr != nil {
			return false, errors.Join(serr, err)
		}
	}
}

// handleOne processes m until it succeeds or is parked. Once it succeeds
// after counted failures, it drops their counter (best effort: Reap drops
// what is left).
func (in *Inbox) handleOne(ctx context.Context, m kafka.Message, h Handler, retry backoff.Policy) error {
	counted, lost := false, 0
	for attempt := 1; ; attempt++ {
		_, err := in.Process(ctx, []kafka.Message{m}, h)
		var he *HandlerError
		var cl *connLostError
		if errors.As(err, &cl) {
			// Once, the database's trouble; every time on this message
			// (it ends its own backend, or idles past the server's
			// timeout), the message's: counted, so it can be parked.
			if lost++; lost > in.max {
				he = &HandlerError{Msg: m, Err: cl.error}
				err = he
			}
		}
		switch {
		case err == nil:
			if id, _ := in.id(m); counted {
				if _, err := in.db.Exec(ctx, in.clearSQL, in.over.Args(in.consumer, id)...); err != nil {
					in.log.Warn("inbox: clearing an attempt counter failed", "err", err)
				}
			}
			return nil
		case errors.As(err, &he) || errors.Is(err, ErrNoID):
			cause := err
			if he != nil {
				cause = he.Err
			}
			parked, ferr := in.fail(ctx, m, cause)
			counted = counted || ferr == nil
			if ferr != nil {
				err = ferr // the database is in trouble: back off below
			} else if parked {
				return nil
			}
		default:
			in.log.Warn("inbox: message failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
		}
		if serr := backoff.Sleep(ctx, retry.Delay(attempt+1)); serr != nil {
			return errors.Join(serr, err)
		}
	}
}
