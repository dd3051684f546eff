package partition

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/handlerpanic"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// exhaustedError is a batch's last failure once it may not be tried
// again: MaxAttempts failures of a single message, or the first failure
// of a batch of several, which is then split.
type exhaustedError struct {
	attempts int
	err      error
}

func (e *exhaustedError) Error() string { return e.err.Error() }
func (e *exhaustedError) Unwrap() error { return e.err }

// applyRetrying applies one batch, retrying transient failures for as long
// as the generation lasts. Other failures end it with an *exhaustedError:
// the first one for a batch of several messages (the caller splits it),
// the MaxAttempts-th for a single message (the caller parks it).
func (c *Consumer) applyRetrying(runCtx, genCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message, log *slog.Logger) error {
	limit := c.cfg.MaxAttempts
	if len(msgs) > 1 {
		limit = 1
	}
	failures, lost := 0, 0
	start := time.Now()
	for attempt := 1; ; attempt++ {
		retry, err := c.apply(runCtx, cl, prev, next, msgs)
		if err == nil {
			c.note(runCtx, EventCommitted, cl, -1, observe.Event{N: int64(len(msgs)), Attempt: attempt, Duration: time.Since(start)})
		}
		if err == nil || errors.Is(err, ErrFenced) {
			return err
		}
		// A connection lost under the handler is the database's trouble
		// once; twice in a row, it may be the batch's own doing (a
		// message whose effect ends its session): it counts, so that the
		// message is isolated and parked rather than retried for ever.
		if lost = lost + 1; !errors.Is(err, errConnLostInHandler) {
			lost = 0
		} else if lost >= 2 {
			retry = false
		}
		if !retry {
			if failures++; failures >= limit {
				return &exhaustedError{attempts: failures, err: err}
			}
		}
		log.Warn("partition: batch failed, retrying", "offset", msgs[0].Offset, "messages", len(msgs), "attempt", attempt, "transient", retry, "err", err)
		delay := c.retry.Delay(min(attempt+1, 30))
		c.note(runCtx, EventRetry, cl, -1, observe.Event{N: int64(len(msgs)), Attempt: attempt, Duration: delay, Err: err})
		if backoff.Sleep(genCtx, delay) != nil {
			return errGenerationEnded
		}
	}
}

// isolate applies msgs, whose batch failed, one message per transaction
// from the stored offset prev; a message that fails MaxAttempts times on
// its own is parked, and the next one follows. It returns how many it
// parked.
func (c *Consumer) isolate(runCtx, genCtx context.Context, cl Claim, prev *int64, msgs []kafka.Message, log *slog.Logger) (parked int, err error) {
	log.Warn("partition: batch failed, applying its messages one at a time", "offset", msgs[0].Offset, "messages", len(msgs))
	for _, m := range msgs {
		next := m.Offset + 1
		err := c.applyRetrying(runCtx, genCtx, cl, prev, next, []kafka.Message{m}, log)
		if ex := (*exhaustedError)(nil); errors.As(err, &ex) {
			var p bool
			if p, err = c.parkRetrying(runCtx, genCtx, cl, prev, m, ex, log); p {
				parked++
			}
		}
		if err != nil {
			return parked, err
		}
		prev = &next
	}
	return parked, nil
}

// apply runs one attempt of a batch: begin, fence, handler, commit. It
// reports whether a failure is transient: every failure before the
// handler runs is, BatchTimeout included; a timeout in the handler is not
// (the batch itself may be too slow); a commit whose outcome is unknown
// is (see commitTransient). The commit runs under the Consumer's
// Committer: neither BatchTimeout nor the caller cancels it in flight. Its context carries the claim
// and lasts BatchTimeout; it does not end with the generation or with Run,
// so a batch in flight finishes instead of being cut off.
func (c *Consumer) apply(runCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message) (retry bool, err error) {
	if c.beforeBatch != nil {
		c.beforeBatch(cl, msgs)
	}
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(runCtx), claimKey{}, cl), c.cfg.BatchTimeout)
	defer cancel()
	// Until the handler runs, a failure says nothing about the batch: a
	// Begin or fence that ran out of BatchTimeout met an unreachable or
	// stalled PostgreSQL (or a row lock still held), which is waited out.
	tx, err := c.pg.Begin(ctx, c.db)
	if err != nil {
		return true, errfmt.Errorf("partition: begin %s: %w", cl, err)
	}
	defer rollback(tx)
	outcome, err := c.checkFence(ctx, tx, cl, prev, next)
	if err != nil {
		return !errors.Is(err, ErrFenced) && (ctx.Err() != nil || transient(err, tx)), err
	}
	if outcome == fenceApplied {
		return false, nil
	}
	if err := callHandler(ctx, c.handler, tx.Handed(), msgs); err != nil {
		tx.Learn(err)
		err = errfmt.Errorf("partition: handler on %s at offset %d: %w", cl, msgs[0].Offset, err)
		if tx.Conn().IsClosed() && ctx.Err() == nil {
			err = errfmt.Errorf("%w: %w", errConnLostInHandler, err)
		}
		return handlerTransient(err, tx) && ctx.Err() == nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		// A commit whose outcome is unknown (the connection failed, or
		// BatchTimeout ended the wait; the commit itself is never
		// cancelled) is retried, not counted: the next attempt's fence
		// waits for the row lock, so for the commit to end, and finds
		// the row at this batch's end if it committed. Until then the
		// batch is not done, and nothing is committed to Kafka for it.
		return commitTransient(err), errfmt.Errorf("partition: commit %s at offset %d: %w", cl, msgs[0].Offset, err)
	}
	return false, nil
}

// errConnLostInHandler marks a failure during which the handler's
// connection died (see applyRetrying).
var errConnLostInHandler = errors.New("connection lost under the handler")

// commitTransient reports whether a failed COMMIT is worth another
// attempt: its outcome is unknown (the next attempt's fence finds out
// whether it committed; until then nothing is acknowledged), nothing was
// sent, or the server refused it for a transient reason. It does not touch
// the transaction, whose commit may still be in flight.
func commitTransient(err error) bool {
	switch pgerr.Of(err) {
	case pgerr.Unknown, pgerr.NotSent:
		return true
	}
	return transient(err, nil)
}

// PanicError is a handler's panic that Run recovered: the message counts
// as failed (and is parked after the attempts), the process lives on.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
}

// Error gives the panic's value, then the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("partition: handler panicked: %v\n%s", e.Value, e.Stack)
}

func newPanicError(value any, stack []byte) error { return &PanicError{value, stack} }

// HandlerError is a Handler's failure: Err is what it returned (or a
// *PanicError), Msg the first message of the batch it failed on. A batch
// of several that fails is split, so the error a message is parked with
// names that message. ReplayParked returns one; EventRetry and EventParked
// carry one as Err.
type HandlerError struct {
	Msg kafka.Message
	Err error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("partition: handler failed on %s: %v", kafkapark.EventKey(e.Msg.Topic, e.Msg.Partition, e.Msg.Offset), e.Err)
}

func (e *HandlerError) Unwrap() error { return e.Err }

// callHandler runs h, turning a panic into a *PanicError: the handler runs
// on a kafka-go goroutine, where an unrecovered panic ends the process.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, msgs []kafka.Message) (err error) {
	defer handlerpanic.Recover(&err, newPanicError)
	return h(ctx, tx, msgs)
}

// handlerTransient is transient for an error the handler returned. A
// panic is never transient, and neither are statement_timeout (57014) and
// lock_timeout (55P03): a handler statement that hits them may hit them on
// every attempt, so they count toward MaxAttempts instead of being retried
// for the whole generation. They stay transient for the package's own
// statements (fence, commit).
func handlerTransient(err error, tx pgx.Tx) bool {
	var pe *PanicError
	if errors.As(err, &pe) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03") {
		return false
	}
	return transient(err, tx)
}
