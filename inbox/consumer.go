package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
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

// WithBatch processes up to n messages per transaction, waiting at most
// linger for more after the first (default 1: a transaction per message).
// Larger batches commit less often; a failing message is then retried on
// its own so the others are not held back.
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

// Run consumes r until ctx ends: it fetches messages, processes each batch
// through the inbox in one transaction, and commits their Kafka offsets only
// after that transaction committed. A message whose handler fails is
// retried on its own with backoff; its attempts are counted outside the
// failing transaction, and after the Inbox's max attempts (at once for a
// Permanent error or a message without identity) it is parked and the
// partition moves on. Errors reaching the database are retried with
// backoff; Run returns nil when ctx ends, after finishing (or, past the
// shutdown timeout, abandoning) the batch in flight. It returns an error
// only for bad input or when r fails for a reason other than ctx.
func (in *Inbox) Run(ctx context.Context, r Reader, h Handler, opts ...RunOption) error {
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
	for {
		batch, err := fetch(ctx, r, cfg.batch, cfg.linger)
		if len(batch) == 0 {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("inbox: fetch: %w", err)
		}
		// The batch in flight outlives ctx by at most the shutdown timeout.
		work, cancel := context.WithCancel(context.WithoutCancel(ctx))
		stop := context.AfterFunc(ctx, func() {
			t := time.AfterFunc(cfg.shutdown, cancel)
			context.AfterFunc(work, func() { t.Stop() })
		})
		err = in.handle(work, batch, recovering(h), cfg.retry)
		if err == nil {
			err = r.CommitMessages(work, batch...)
			if err != nil && ctx.Err() == nil {
				// The effects are recorded; a lost commit only means a
				// redelivery, which the inbox skips.
				in.log.Warn("inbox: offset commit failed", "err", err)
				err = nil
			}
		}
		stop()
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
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

// fetch blocks for one message, then takes up to n-1 more that arrive
// within linger.
func fetch(ctx context.Context, r Reader, n int, linger time.Duration) ([]kafka.Message, error) {
	m, err := r.FetchMessage(ctx)
	if err != nil {
		return nil, err
	}
	batch := []kafka.Message{m}
	if n == 1 {
		return batch, nil
	}
	lctx, cancel := context.WithTimeout(ctx, linger)
	defer cancel()
	for len(batch) < n {
		m, err := r.FetchMessage(lctx)
		if err != nil {
			break
		}
		batch = append(batch, m)
	}
	return batch, nil
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
				if _, err := in.db.Exec(ctx, in.clearSQL, in.consumer, id); err != nil {
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
