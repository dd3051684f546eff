package inbox

import (
	"context"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// fail counts a failed attempt at msg outside any transaction and, when it
// is permanent or the attempts ran out, parks it: records it as processed
// (so it never runs again) and keeps it in the parked table, in one
// transaction, then calls the hook. A message found processed meanwhile
// (another member applied it, or it was parked before) is not parked
// again. It reports whether msg is done with. It is bounded by the batch
// timeout.
func (in *Inbox) fail(ctx context.Context, msg kafka.Message, cause error, permanent bool) (parked bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, in.batchTimeout)
	defer cancel()
	id, idErr := in.id(msg)
	if idErr != nil {
		// A message without an identity cannot be deduplicated: park it,
		// known by its offset.
		cause = errfmt.Errorf("%w; %w", cause, idErr)
		id, _ = ByOffset().id(msg)
	}
	var attempts int
	if err := in.db.QueryRow(ctx, in.attemptSQL, in.over.Args(in.consumer, id, kafkapark.Text(cause.Error()))...).Scan(&attempts); err != nil {
		return false, errfmt.Errorf("inbox: count attempt: %w", err)
	}
	if !permanent && idErr == nil && attempts < in.attempts {
		in.log.Warn("inbox: handler failed; will retry", "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "attempt", attempts, "err", cause)
		in.note(ctx, EventRetry, msg, false, observe.Event{N: 1, Attempt: attempts, Err: cause})
		return false, nil
	}
	var fresh []bool
	parkedMessageID := id
	if in.identity.watermark {
		parkedMessageID = "" // recorded by the watermark, not by id
	}
	err = in.inTx(ctx, func(tx *pgerr.Tx) error {
		var err error
		if fresh, err = in.claim(ctx, tx, []kafka.Message{msg}, []string{id}); err != nil {
			return err
		}
		if fresh[0] { // else processed meanwhile (by another member, or parked before): nothing to park
			if err := in.parked.Park(ctx, tx, in.consumer, msg, cause, attempts, 0, parkedMessageID); err != nil {
				return errfmt.Errorf("inbox: park: %w", err)
			}
		}
		_, err = tx.Exec(ctx, in.clearSQL, in.consumer, id)
		return err
	})
	if err != nil || !fresh[0] {
		return err == nil, err
	}
	in.counts.parked.Add(1)
	in.counts.handled(msg)
	in.log.Error("inbox: message parked", "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "attempts", attempts, "err", cause)
	in.note(ctx, EventParked, msg, true, observe.Event{N: 1, Attempt: attempts, Err: cause})
	return true, nil
}
