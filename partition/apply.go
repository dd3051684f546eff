package partition

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/handlerfail"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/observed"
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

// applyRetrying applies one batch, retrying transient failures of the
// package's own statements for as long as the generation lasts, and the
// database's trouble under the Handler (handlerfail.Database) without
// counting while it came at most MaxAttempts times in a row. Other
// failures end it with an *exhaustedError: the first counted one for a
// batch of several messages (the caller splits it), a Permanent one or the
// MaxAttempts-th counted one for a single message (the caller parks it).
//
// It is the call CallHandle: the observer's Start first, whose context the
// Handler and the batch's events get, then End with EventCommitted or
// EventFailed.
func (c *Consumer) applyRetrying(runCtx, genCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message, log *slog.Logger) error {
	if c.cfg.Observer == nil {
		_, err := c.applyAttempts(runCtx, genCtx, cl, prev, next, msgs, log)
		return err
	}
	key := kafkapark.EventKey(cl.Topic, cl.Partition, -1)
	runCtx, sp := observed.Start(c.cfg.Observer, runCtx, observe.Call{Name: CallHandle, Key: key, Message: kafkapark.Observed(msgs[0])})
	start := time.Now()
	attempt, err := c.applyAttempts(runCtx, genCtx, cl, prev, next, msgs, log)
	e := observe.Event{Name: EventCommitted, Key: key, Token: cl.Epoch, N: int64(len(msgs)), Attempt: attempt, Duration: time.Since(start)}
	if err != nil {
		e.Name, e.Err = EventFailed, err
		if ex := (*exhaustedError)(nil); errors.As(err, &ex) {
			e.Err = ex.err
		}
	}
	sp.End(e)
	return err
}

// applyAttempts is applyRetrying's work; it returns the attempts made.
func (c *Consumer) applyAttempts(runCtx, genCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message, log *slog.Logger) (int, error) {
	limit := c.cfg.MaxAttempts
	if len(msgs) > 1 {
		limit = 1
	}
	failures := 0
	tally := handlerfail.Tally{Bound: c.cfg.MaxAttempts}
	for attempt := 1; ; attempt++ {
		retry, kind, err := c.apply(runCtx, cl, prev, next, msgs)
		if err == nil || errors.Is(err, ErrFenced) {
			return attempt, err
		}
		counted := !retry && tally.Counts(kind)
		if counted {
			if failures++; kind == handlerfail.Permanent || failures >= limit {
				return attempt, &exhaustedError{attempts: failures, err: err}
			}
		}
		log.Warn("partition: batch failed, retrying", "offset", msgs[0].Offset, "messages", len(msgs), "attempt", attempt, "counted", counted, "err", err)
		delay := c.retry.Delay(min(attempt+1, 30))
		c.note(runCtx, EventRetry, cl, -1, observe.Event{N: int64(len(msgs)), Attempt: attempt, Duration: delay, Err: err})
		if backoff.Sleep(genCtx, delay) != nil {
			return attempt, errGenerationEnded
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
// reports whether a failure is transient (retried, never counted): every
// failure before the handler runs is, BatchTimeout included; a commit
// whose outcome is unknown is (see commitTransient). A Handler's failure
// is a *HandlerError, of the kind handlerfail.Classify gives it: a timeout
// in the handler counts (the batch itself may be too slow). The commit runs under the Consumer's
// Committer: neither BatchTimeout nor the caller cancels it in flight. Its context carries the claim
// and lasts BatchTimeout; it does not end with the generation or with Run,
// so a batch in flight finishes instead of being cut off.
func (c *Consumer) apply(runCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message) (retry bool, kind handlerfail.Kind, err error) {
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
		return true, handlerfail.Counted, errfmt.Errorf("partition: begin %s: %w", cl, err)
	}
	defer rollback(tx)
	outcome, err := c.checkFence(ctx, tx, cl, prev, next)
	if err != nil {
		return !errors.Is(err, ErrFenced) && (ctx.Err() != nil || transient(err, tx)), handlerfail.Counted, err
	}
	if outcome == fenceApplied {
		c.stats.duplicated(cl, len(msgs))
		c.log.Info("partition: skipped a batch an earlier attempt committed (its commit was reported lost)",
			"claim", cl.String(), "first", msgs[0].Offset, "messages", len(msgs))
		return false, handlerfail.Counted, nil
	}
	if err := callHandler(ctx, c.handler, tx.Handed(), msgs); err != nil {
		tx.Learn(err)
		expired := ctx.Err() != nil
		kind := handlerfail.Classify(err, tx.Conn().IsClosed() && !expired, expired)
		return false, kind, &HandlerError{Msg: msgs[0], Err: err}
	}
	if err := tx.Commit(ctx); err != nil {
		// A commit whose outcome is unknown (the connection failed, or
		// BatchTimeout ended the wait; the commit itself is never
		// cancelled) is retried, not counted: the next attempt's fence
		// waits for the row lock, so for the commit to end, and finds
		// the row at this batch's end if it committed. Until then the
		// batch is not done, and nothing is committed to Kafka for it.
		return commitTransient(err), handlerfail.Counted, errfmt.Errorf("partition: commit %s at offset %d: %w", cl, msgs[0].Offset, err)
	}
	return false, handlerfail.Counted, nil
}

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
