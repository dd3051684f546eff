package partition

import (
	"context"
	"errors"
	"log/slog"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkatxn"
)

// ErrOffsetLost means the partition's stored next offset is below the
// first offset Kafka still has (retention deleted the messages, or the
// records were deleted): the messages in between are lost. The worker
// applies nothing past the gap and Run stops with an error wrapping
// ErrOffsetLost that names both offsets; the stored offset stays where it
// was. Moving next_offset past the gap is an operator's decision.
var ErrOffsetLost = errors.New("partition: stored offset no longer in Kafka")

// checkGap is called when a batch starts above the stored offset prev. It
// asks Kafka for the partition's first offset, retrying failures for as
// long as the generation lasts: above prev, messages were deleted and it
// returns an error wrapping ErrOffsetLost; otherwise the gap is
// compaction's and it returns nil.
func (c *Consumer) checkGap(genCtx context.Context, a assignment, prev int64, log *slog.Logger) error {
	for attempt := 1; ; attempt++ {
		first, err := c.firstOffset(genCtx, a)
		if err == nil {
			if first > prev {
				return errfmt.Errorf("partition: %s/%d: stored next offset %d is below Kafka's first available offset %d, offsets %d to %d are gone: %w",
					a.topic, a.partition, prev, first, prev, first-1, ErrOffsetLost)
			}
			return nil
		}
		if genCtx.Err() != nil {
			return errGenerationEnded
		}
		log.Warn("partition: asking Kafka for the first offset failed, retrying", "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return errGenerationEnded
		}
	}
}

// firstOffset asks Kafka for a's partition's first (log start) offset.
func (c *Consumer) firstOffset(ctx context.Context, a assignment) (int64, error) {
	res, err := c.kafka.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{a.topic: {kafka.FirstOffsetOf(a.partition)}},
	})
	if err != nil {
		return 0, errfmt.Errorf("list offsets: %w", err)
	}
	for _, p := range res.Topics[a.topic] {
		if p.Partition != a.partition {
			continue
		}
		if p.Error != nil {
			return 0, errfmt.Errorf("list offsets: %w", p.Error)
		}
		return p.FirstOffset, nil
	}
	return 0, errfmt.Errorf("list offsets: no answer for %s/%d", a.topic, a.partition)
}

// fetched is one batch read from the Reader: the messages to apply, in
// offset order, and the offsets the Reader delivered, skipped ones
// included.
type fetched struct {
	msgs  []kafka.Message
	first int64 // the first offset delivered
	next  int64 // the offset after the last one delivered

	// For Stats, also on failure: the high-water mark the last fetch
	// reported (-1: none), records skipped, classifying fetches failed.
	hwm      int64
	skipped  int
	failures int
}

// fetch returns the next batch: it waits for one message as long as
// fetchCtx lasts, then takes the messages Kafka already reported behind
// it (the reader's lag), up to the max batch, waiting at most the batch
// wait for them. It never waits for messages not yet produced. Control records
// and, read committed, records of aborted transactions are left out; the
// batch's msgs may then be empty. Classifying a message is retried for as
// long as genCtx lasts: the Reader has handed it over and will not again.
func (c *Consumer) fetch(fetchCtx, genCtx context.Context, r *kafka.Reader, f *kafkatxn.Filter, log *slog.Logger) (fetched, error) {
	m, err := r.FetchMessage(fetchCtx)
	if err != nil {
		return fetched{first: -1, hwm: -1}, err
	}
	b := fetched{first: m.Offset}
	if err := c.add(genCtx, f, &b, m, log); err != nil {
		return b, err
	}
	if c.cfg.MaxBatch == 1 || r.Lag() <= 0 {
		return b, nil
	}
	ctx, cancel := context.WithTimeout(genCtx, c.cfg.BatchWait)
	defer cancel()
	for len(b.msgs) < c.cfg.MaxBatch && r.Lag() > 0 {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			break // hand over what we have; the message stays queued
		}
		if err := c.add(genCtx, f, &b, m, log); err != nil {
			return b, err
		}
	}
	return b, nil
}

// add appends m to b unless it is a control record or, read committed, a
// record of an aborted transaction. A failure to classify it is retried
// with backoff as long as genCtx lasts and the failure is transient.
func (c *Consumer) add(genCtx context.Context, f *kafkatxn.Filter, b *fetched, m kafka.Message, log *slog.Logger) error {
	b.next, b.hwm = m.Offset+1, m.HighWaterMark
	for attempt := 1; ; attempt++ {
		skip, err := f.Skip(genCtx, m)
		if err == nil {
			if skip {
				b.skipped++
				log.Debug("partition: skipped a control record or a record of an aborted transaction", "offset", m.Offset)
			} else {
				b.msgs = append(b.msgs, m)
			}
			return nil
		}
		b.failures++
		if genCtx.Err() != nil || !kafkaerr.Retriable(err) {
			return errfmt.Errorf("%w: offset %d: %w", errClassify, m.Offset, err)
		}
		log.Warn("partition: classifying a record failed, retrying", "offset", m.Offset, "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return errfmt.Errorf("%w: offset %d: %w", errClassify, m.Offset, err)
		}
	}
}

// errClassify marks a fetch that failed after the Reader handed over a
// message: telling whether it is a control or an aborted record failed
// for good, or the generation ended meanwhile.
var errClassify = errors.New("partition: classifying a record")
