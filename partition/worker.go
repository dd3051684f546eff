package partition

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkatxn"
	"github.com/nolock/nolock/observe"
)

// errGenerationEnded stops a worker's retries when its generation ends.
var errGenerationEnded = errors.New("partition: generation ended")

// work owns one partition for one generation: it claims the partition,
// reads it from the stored offset and applies it batch by batch until the
// generation ends or the worker is fenced. It returns an error only when
// Run must stop. runCtx carries the caller's values; genCtx ends with the
// generation.
//
// Returning ends the generation for the whole member (kafka-go's rule), so
// the worker returns only when it is done with the partition: transient
// errors are retried here, with backoff, for as long as the generation
// lasts.
func (c *Consumer) work(runCtx, genCtx context.Context, gen *kafka.Generation, a assignment) error {
	if genCtx.Err() != nil {
		return nil // kafka-go starts functions even after the generation ended
	}
	log := c.log.With("topic", a.topic, "partition", a.partition, "generation", a.generation)
	cl, prev, err := c.claimRetrying(genCtx, a, log)
	if err != nil {
		if errors.Is(err, errGenerationEnded) {
			err = nil
		}
		c.release(runCtx, cl, err, log, time.Time{})
		return nil
	}
	claimedAt := time.Now()
	c.note(runCtx, EventClaimed, cl, -1, observe.Event{})
	log = log.With("epoch", cl.Epoch)
	log.Info("partition: claimed", "offset", cl.Offset)
	st := c.stats.claimed(cl, prev)
	defer st.released()
	if c.cfg.OnClaim != nil {
		c.cfg.OnClaim(cl)
	}
	r := c.newReader(a, log)
	defer r.Close()
	if err := r.SetOffset(cl.Offset); err != nil {
		c.release(runCtx, cl, err, log, claimedAt)
		return nil
	}
	w := &worker{
		c: c, gen: gen, a: a, cl: cl, log: log, r: r, stats: st,
		// The Reader hands over control records and, read committed, the
		// records of aborted transactions too; the filter tells them apart.
		filter: kafkatxn.New(c.transport, kafka.TCP(c.cfg.Brokers...), a.topic, a.partition, !c.cfg.ReadUncommitted),
		prev:   prev,
		expect: prev, // the offset the Reader should deliver next, if known
	}
	err = w.loop(runCtx, genCtx)
	c.release(runCtx, cl, err, log, claimedAt)
	if errors.Is(err, ErrFenced) {
		return nil // the newer owner goes on; Run does not stop
	}
	return err
}

// newReader returns a group-less Reader of a's partition.
func (c *Consumer) newReader(a assignment, log *slog.Logger) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Brokers:        c.cfg.Brokers,
		Topic:          a.topic,
		Partition:      a.partition,
		Dialer:         c.cfg.Dialer,
		MinBytes:       c.cfg.MinBytes,
		MaxBytes:       c.cfg.MaxBytes,
		MaxWait:        c.cfg.MaxWait,
		IsolationLevel: c.cfg.isolation(),
		QueueCapacity:  max(100, c.cfg.MaxBatch),
		Logger:         kafkaLogger(log, slog.LevelDebug-4), // below Debug: the reader is chatty
		ErrorLogger:    kafkaLogger(log, slog.LevelWarn),
	})
}

// worker is one claimed partition being read and applied, for one
// generation. It is used by one goroutine.
type worker struct {
	c      *Consumer
	gen    *kafka.Generation
	a      assignment
	cl     Claim
	log    *slog.Logger
	r      *kafka.Reader
	filter *kafkatxn.Filter
	stats  *partStats
	prev   *int64 // the stored next offset (nil: none yet)
	expect *int64 // the offset the Reader should deliver next, if known

	fetchFailures int

	// Informational Kafka commits (KafkaCommitInterval): at most one per
	// interval, and the trailing offset of a burst once the partition
	// stays idle until the interval is up, or when the worker lets go.
	lastKafkaCommit time.Time
	pending         int64
	hasPending      bool
}

// loop fetches and applies batches until the worker must let go. It
// returns nil when the generation ended, an error wrapping ErrFenced when
// a newer owner exists, and any other error that stops Run.
func (w *worker) loop(runCtx, genCtx context.Context) error {
	for {
		b, stop, err := w.fetchBatch(genCtx)
		if !stop {
			stop, err = w.handle(runCtx, genCtx, b)
		}
		if stop {
			return err
		}
	}
}

// commitKafka commits the pending offset to Kafka, if any (best effort).
func (w *worker) commitKafka() {
	if !w.hasPending {
		return
	}
	w.lastKafkaCommit, w.hasPending = time.Now(), false
	if err := w.gen.CommitOffsets(map[string]map[int]int64{w.a.topic: {w.a.partition: w.pending}}); err != nil {
		w.log.Debug("partition: kafka commit (informational) failed", "err", err)
	}
}

// fetchBatch returns the next batch. While an informational Kafka commit
// is pending it waits only until the interval is up, then commits it and
// waits on; transient fetch failures are retried with backoff. stop
// reports that the worker must let go: err is nil when the generation
// ended.
func (w *worker) fetchBatch(genCtx context.Context) (fetched, bool, error) {
	for {
		fetchCtx, cancelFetch := genCtx, context.CancelFunc(func() {})
		if w.hasPending {
			fetchCtx, cancelFetch = context.WithDeadline(genCtx, w.lastKafkaCommit.Add(w.c.cfg.KafkaCommitInterval))
		}
		b, err := w.c.fetch(fetchCtx, genCtx, w.r, w.filter, w.log)
		cancelFetch()
		w.stats.fetched(b.first, b.hwm, b.skipped, b.failures)
		if err == nil {
			w.fetchFailures = 0
			return b, false, nil
		}
		classify := errors.Is(err, errClassify) // the Reader's message is gone: never retried here
		if !classify && genCtx.Err() == nil && fetchCtx.Err() != nil {
			w.commitKafka() // idle: commit the burst's trailing offset
			continue
		}
		if !classify && genCtx.Err() == nil {
			w.stats.fetched(-1, -1, 0, 1) // the read failed; a classifying fetch counted itself
		}
		if !classify && genCtx.Err() == nil && kafkaerr.Retriable(err) {
			// The reader reconnects by itself; keep the partition.
			w.fetchFailures++
			w.log.Warn("partition: fetch failed, retrying", "attempt", w.fetchFailures, "err", err)
			if backoff.Sleep(genCtx, w.c.retry.Delay(min(w.fetchFailures+1, 30))) == nil {
				continue
			}
		}
		w.commitKafka()
		if genCtx.Err() != nil {
			return fetched{}, true, nil
		}
		return fetched{}, true, errfmt.Errorf("partition: %s: fetch: %w", w.cl, err)
	}
}

// handle applies batch b from the stored offset: a batch that fails is
// split, a message whose attempts ran out is parked. stop reports that the
// worker must let go, with the reason as fetchBatch's.
func (w *worker) handle(runCtx, genCtx context.Context, b fetched) (stop bool, err error) {
	c := w.c
	if w.expect != nil && b.first > *w.expect {
		// kafka-go moves an offset below the log start up to it without
		// a word; tell that apart from a compaction gap.
		if err := c.checkGap(genCtx, w.a, *w.expect, w.log); err != nil {
			if errors.Is(err, errGenerationEnded) {
				err = nil
			}
			w.commitKafka()
			return true, err
		}
	}
	w.expect = &b.next
	msgs := b.msgs
	if len(msgs) == 0 {
		w.stats.handled(b.next, -1, 0, 0)
		return false, nil // only control records or aborted ones
	}
	next := msgs[len(msgs)-1].Offset + 1
	parked := 0
	err = c.applyRetrying(runCtx, genCtx, w.cl, w.prev, next, msgs, w.log)
	if ex := (*exhaustedError)(nil); errors.As(err, &ex) {
		if len(msgs) == 1 {
			var p bool
			if p, err = c.parkRetrying(runCtx, genCtx, w.cl, w.prev, msgs[0], ex, w.log); p {
				parked = 1
			}
		} else {
			parked, err = c.isolate(runCtx, genCtx, w.cl, w.prev, msgs, w.log)
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, errGenerationEnded):
		w.commitKafka()
		return true, nil
	case errors.Is(err, ErrFenced):
		return true, err
	default:
		w.commitKafka()
		return true, err
	}
	w.prev = &next
	w.stats.handled(b.next, next-1, len(msgs)-parked, parked)
	if iv := c.cfg.KafkaCommitInterval; iv > 0 {
		w.pending, w.hasPending = next, true
		if time.Since(w.lastKafkaCommit) >= iv {
			w.commitKafka()
		}
	}
	if genCtx.Err() != nil {
		w.commitKafka()
		return true, nil
	}
	return false, nil
}

// claimRetrying claims a's partition, retrying transient failures for as
// long as the generation lasts. A refusal (ErrFenced) is final.
func (c *Consumer) claimRetrying(genCtx context.Context, a assignment, log *slog.Logger) (Claim, *int64, error) {
	for attempt := 1; ; attempt++ {
		cl, prev, err := c.claim(genCtx, a)
		if err == nil || errors.Is(err, ErrFenced) {
			return cl, prev, err
		}
		if genCtx.Err() != nil {
			return cl, nil, errGenerationEnded
		}
		log.Warn("partition: claim failed, retrying", "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return cl, nil, errGenerationEnded
		}
	}
}

// release reports the end of a worker's ownership, claimed at
// claimedAt (zero if the claim failed).
func (c *Consumer) release(ctx context.Context, cl Claim, err error, log *slog.Logger, claimedAt time.Time) {
	switch {
	case err == nil:
		log.Info("partition: released")
	case errors.Is(err, ErrFenced):
		log.Info("partition: fenced", "err", err)
		c.note(ctx, EventFenced, cl, -1, observe.Event{Err: err})
	default:
		log.Warn("partition: worker stopped", "err", err)
	}
	if !claimedAt.IsZero() {
		c.note(ctx, EventReleased, cl, -1, observe.Event{Duration: time.Since(claimedAt), Err: err})
	}
	if c.cfg.OnRelease != nil {
		c.cfg.OnRelease(cl, err)
	}
}
