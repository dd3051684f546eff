package partition

import (
	"context"
	"errors"
	"log/slog"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/observe"
)

// parkRetrying parks m, whose attempts ran out, retrying transient
// failures for as long as the generation lasts, then reports it; parked
// reports that this call parked it (not an earlier attempt's commit found
// applied without a parked row). It
// returns an error wrapping ErrFenced if a newer owner exists, and any
// other failure to park, which stops Run (the parked table is missing,
// say): skipping m unrecorded is never an option.
func (c *Consumer) parkRetrying(runCtx, genCtx context.Context, cl Claim, prev *int64, m kafka.Message, ex *exhaustedError, log *slog.Logger) (bool, error) {
	for attempt := 1; ; attempt++ {
		parked, retry, err := c.park(runCtx, cl, prev, m, ex)
		if err == nil {
			if parked {
				log.Error("partition: message parked", "offset", m.Offset, "attempts", ex.attempts, "err", ex.err)
				c.note(runCtx, EventParked, cl, m.Offset, observe.Event{N: 1, Attempt: ex.attempts, Err: ex.err})
			}
			return parked, nil
		}
		if errors.Is(err, ErrFenced) || !retry {
			return false, errfmt.Errorf("partition: %s: parking offset %d after %d failed attempts (%v): %w", cl, m.Offset, ex.attempts, ex.err, err)
		}
		log.Warn("partition: parking failed, retrying", "offset", m.Offset, "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return false, errGenerationEnded
		}
	}
}

// park runs one attempt at parking m: begin, fence (moving the stored
// offset from prev past m), insert the parked row, commit. If the fence
// finds the offset already moved under this epoch, an earlier attempt whose
// commit outcome was unknown did commit; the parked row tells whether it
// was this park (parked true) or not. It reports whether a failure is
// transient, as apply does.
func (c *Consumer) park(runCtx context.Context, cl Claim, prev *int64, m kafka.Message, ex *exhaustedError) (parked, retry bool, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), c.cfg.BatchTimeout)
	defer cancel()
	tx, err := c.pg.Begin(ctx, c.db)
	if err != nil {
		return false, true, errfmt.Errorf("partition: begin %s: %w", cl, err)
	}
	defer rollback(tx)
	outcome, err := c.checkFence(ctx, tx, cl, prev, m.Offset+1)
	if err != nil {
		return false, !errors.Is(err, ErrFenced) && (ctx.Err() != nil || transient(err, tx)), err
	}
	if outcome == fenceApplied {
		parked, err := c.parked.Exists(ctx, tx, cl.GroupID, kafkapark.ID{Topic: cl.Topic, Partition: cl.Partition, Offset: m.Offset})
		if err != nil {
			return false, true, errfmt.Errorf("partition: park %s at offset %d: %w", cl, m.Offset, err)
		}
		return parked, false, nil
	}
	if err := c.parked.Park(ctx, tx, cl.GroupID, m, ex.err, ex.attempts, cl.Epoch, ""); err != nil {
		return false, ctx.Err() != nil || transient(err, tx), errfmt.Errorf("partition: park %s at offset %d: %w", cl, m.Offset, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, commitTransient(err), errfmt.Errorf("partition: commit park %s at offset %d: %w", cl, m.Offset, err)
	}
	return true, false, nil
}
