package partition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkatxn"
	"github.com/nolock/nolock/internal/pgerr"
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
		c.release(cl, err, log)
		return nil
	}
	log = log.With("epoch", cl.Epoch)
	log.Info("partition: claimed", "offset", cl.Offset)
	if c.cfg.OnClaim != nil {
		c.cfg.OnClaim(cl)
	}

	isolation := kafka.ReadCommitted
	if c.cfg.ReadUncommitted {
		isolation = kafka.ReadUncommitted
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        c.cfg.Brokers,
		Topic:          a.topic,
		Partition:      a.partition,
		Dialer:         c.cfg.Dialer,
		MaxWait:        time.Second,
		IsolationLevel: isolation,
		QueueCapacity:  max(100, c.cfg.MaxBatch),
		Logger:         kafkaLogger(log, slog.LevelDebug-4), // below Debug: the reader is chatty
		ErrorLogger:    kafkaLogger(log, slog.LevelWarn),
	})
	defer r.Close()
	if err := r.SetOffset(cl.Offset); err != nil {
		c.release(cl, err, log)
		return nil
	}
	// The Reader hands over control records and, read committed, the
	// records of aborted transactions too; the filter tells them apart.
	filter := kafkatxn.New(c.transport, kafka.TCP(c.cfg.Brokers...), a.topic, a.partition, !c.cfg.ReadUncommitted)
	expect := prev // the offset the Reader should deliver next, if known

	// Informational Kafka commits (KafkaCommitInterval): at most one per
	// interval, and the trailing offset of a burst once the partition
	// stays idle until the interval is up, or when the worker lets go.
	var lastKafkaCommit time.Time
	var pending int64
	hasPending := false
	fetchFailures := 0
	commitKafka := func() {
		if !hasPending {
			return
		}
		lastKafkaCommit, hasPending = time.Now(), false
		if err := gen.CommitOffsets(map[string]map[int]int64{a.topic: {a.partition: pending}}); err != nil {
			log.Debug("partition: kafka commit (informational) failed", "err", err)
		}
	}
	for {
		fetchCtx, cancelFetch := genCtx, context.CancelFunc(func() {})
		if hasPending {
			fetchCtx, cancelFetch = context.WithDeadline(genCtx, lastKafkaCommit.Add(c.cfg.KafkaCommitInterval))
		}
		b, err := c.fetch(fetchCtx, genCtx, r, filter, log)
		cancelFetch()
		if err != nil {
			classify := errors.Is(err, errClassify) // the Reader's message is gone: never retried here
			if !classify && genCtx.Err() == nil && fetchCtx.Err() != nil {
				commitKafka() // idle: commit the burst's trailing offset
				continue
			}
			if !classify && genCtx.Err() == nil && kafkaerr.Retriable(err) {
				// The reader reconnects by itself; keep the partition.
				fetchFailures++
				log.Warn("partition: fetch failed, retrying", "attempt", fetchFailures, "err", err)
				if backoff.Sleep(genCtx, c.retry.Delay(min(fetchFailures+1, 30))) == nil {
					continue
				}
			}
			commitKafka()
			if genCtx.Err() != nil {
				c.release(cl, nil, log)
				return nil
			}
			err = fmt.Errorf("partition: %s: fetch: %w", cl, err)
			c.release(cl, err, log)
			return err
		}
		fetchFailures = 0
		if expect != nil && b.first > *expect {
			// kafka-go moves an offset below the log start up to it without
			// a word; tell that apart from a compaction gap.
			if err := c.checkGap(genCtx, a, *expect, log); err != nil {
				if errors.Is(err, errGenerationEnded) {
					err = nil
				}
				commitKafka()
				c.release(cl, err, log)
				return err
			}
		}
		expect = &b.next
		msgs := b.msgs
		if len(msgs) == 0 {
			continue // only control records or aborted ones
		}
		next := msgs[len(msgs)-1].Offset + 1
		err = c.applyRetrying(runCtx, genCtx, cl, prev, next, msgs, log)
		if ex := (*exhaustedError)(nil); errors.As(err, &ex) {
			if len(msgs) == 1 {
				err = c.parkRetrying(runCtx, genCtx, cl, prev, msgs[0], ex, log)
			} else {
				err = c.isolate(runCtx, genCtx, cl, prev, msgs, log)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, errGenerationEnded):
			commitKafka()
			c.release(cl, nil, log)
			return nil
		case errors.Is(err, ErrFenced):
			c.release(cl, err, log)
			return nil
		default:
			commitKafka()
			c.release(cl, err, log)
			return err
		}
		prev = &next
		if iv := c.cfg.KafkaCommitInterval; iv > 0 {
			pending, hasPending = next, true
			if time.Since(lastKafkaCommit) >= iv {
				commitKafka()
			}
		}
		if genCtx.Err() != nil {
			commitKafka()
			c.release(cl, nil, log)
			return nil
		}
	}
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
				return fmt.Errorf("partition: %s/%d: stored next offset %d is below Kafka's first available offset %d, offsets %d to %d are gone: %w",
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
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	for _, p := range res.Topics[a.topic] {
		if p.Partition != a.partition {
			continue
		}
		if p.Error != nil {
			return 0, fmt.Errorf("list offsets: %w", p.Error)
		}
		return p.FirstOffset, nil
	}
	return 0, fmt.Errorf("list offsets: no answer for %s/%d", a.topic, a.partition)
}

// fetched is one batch read from the Reader: the messages to apply, in
// offset order, and the offsets the Reader delivered, skipped ones
// included.
type fetched struct {
	msgs  []kafka.Message
	first int64 // the first offset delivered
	next  int64 // the offset after the last one delivered
}

// fetch returns the next batch: it waits for one message as long as
// fetchCtx lasts, then takes the messages Kafka already reported behind
// it (the reader's lag), up to MaxBatch, waiting at most BatchWait for
// them. It never waits for messages not yet produced. Control records
// and, read committed, records of aborted transactions are left out; the
// batch's msgs may then be empty. Classifying a message is retried for as
// long as genCtx lasts: the Reader has handed it over and will not again.
func (c *Consumer) fetch(fetchCtx, genCtx context.Context, r *kafka.Reader, f *kafkatxn.Filter, log *slog.Logger) (fetched, error) {
	m, err := r.FetchMessage(fetchCtx)
	if err != nil {
		return fetched{}, err
	}
	b := fetched{first: m.Offset}
	if err := c.add(genCtx, f, &b, m, log); err != nil {
		return fetched{}, err
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
			return fetched{}, err
		}
	}
	return b, nil
}

// add appends m to b unless it is a control record or, read committed, a
// record of an aborted transaction. A failure to classify it is retried
// with backoff as long as genCtx lasts and the failure is transient.
func (c *Consumer) add(genCtx context.Context, f *kafkatxn.Filter, b *fetched, m kafka.Message, log *slog.Logger) error {
	b.next = m.Offset + 1
	for attempt := 1; ; attempt++ {
		skip, err := f.Skip(genCtx, m)
		if err == nil {
			if skip {
				log.Debug("partition: skipped a control record or a record of an aborted transaction", "offset", m.Offset)
			} else {
				b.msgs = append(b.msgs, m)
			}
			return nil
		}
		if genCtx.Err() != nil || !kafkaerr.Retriable(err) {
			return fmt.Errorf("%w: offset %d: %w", errClassify, m.Offset, err)
		}
		log.Warn("partition: classifying a record failed, retrying", "offset", m.Offset, "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return fmt.Errorf("%w: offset %d: %w", errClassify, m.Offset, err)
		}
	}
}

// errClassify marks a fetch that failed after the Reader handed over a
// message: telling whether it is a control or an aborted record failed
// for good, or the generation ended meanwhile.
var errClassify = errors.New("partition: classifying a record")

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
	failures := 0
	for attempt := 1; ; attempt++ {
		retry, err := c.apply(runCtx, cl, prev, next, msgs)
		if err == nil || errors.Is(err, ErrFenced) {
			return err
		}
		if !retry {
			if failures++; failures >= limit {
				return &exhaustedError{attempts: failures, err: err}
			}
		}
		log.Warn("partition: batch failed, retrying", "offset", msgs[0].Offset, "messages", len(msgs), "attempt", attempt, "transient", retry, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return errGenerationEnded
		}
	}
}

// isolate applies msgs, whose batch failed, one message per transaction
// from the stored offset prev; a message that fails MaxAttempts times on
// its own is parked, and the next one follows.
func (c *Consumer) isolate(runCtx, genCtx context.Context, cl Claim, prev *int64, msgs []kafka.Message, log *slog.Logger) error {
	log.Warn("partition: batch failed, applying its messages one at a time", "offset", msgs[0].Offset, "messages", len(msgs))
	for _, m := range msgs {
		next := m.Offset + 1
		err := c.applyRetrying(runCtx, genCtx, cl, prev, next, []kafka.Message{m}, log)
		if ex := (*exhaustedError)(nil); errors.As(err, &ex) {
			err = c.parkRetrying(runCtx, genCtx, cl, prev, m, ex, log)
		}
		if err != nil {
			return err
		}
		prev = &next
	}
	return nil
}

// parkRetrying parks m, whose attempts ran out, retrying transient
// failures for as long as the generation lasts, then calls OnPark. It
// returns an error wrapping ErrFenced if a newer owner exists, and any
// other failure to park, which stops Run (the parked table is missing,
// say): skipping m unrecorded is never an option.
func (c *Consumer) parkRetrying(runCtx, genCtx context.Context, cl Claim, prev *int64, m kafka.Message, ex *exhaustedError, log *slog.Logger) error {
	for attempt := 1; ; attempt++ {
		parked, retry, err := c.park(runCtx, cl, prev, m, ex)
		if err == nil {
			if parked {
				log.Error("partition: message parked", "offset", m.Offset, "attempts", ex.attempts, "err", ex.err)
				if c.cfg.OnPark != nil {
					c.cfg.OnPark(m, ex.err)
				}
			}
			return nil
		}
		if errors.Is(err, ErrFenced) || !retry {
			return fmt.Errorf("partition: %s: parking offset %d after %d failed attempts (%v): %w", cl, m.Offset, ex.attempts, ex.err, err)
		}
		log.Warn("partition: parking failed, retrying", "offset", m.Offset, "attempt", attempt, "err", err)
		if backoff.Sleep(genCtx, c.retry.Delay(min(attempt+1, 30))) != nil {
			return errGenerationEnded
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
	tx, err := pgerr.Begin(ctx, c.db)
	if err != nil {
		return false, true, fmt.Errorf("partition: begin %s: %w", cl, err)
	}
	defer rollback(tx)
	outcome, err := c.checkFence(ctx, tx, cl, prev, m.Offset+1)
	if err != nil {
		return false, !errors.Is(err, ErrFenced) && (ctx.Err() != nil || transient(err, tx)), err
	}
	if outcome == fenceApplied {
		err := tx.QueryRow(ctx, c.sql.isParked, cl.GroupID, cl.Topic, cl.Partition, m.Offset).Scan(&parked)
		if err != nil {
			return false, true, fmt.Errorf("partition: park %s at offset %d: %w", cl, m.Offset, err)
		}
		return parked, false, nil
	}
	if _, err := tx.Exec(ctx, c.sql.park, cl.GroupID, cl.Topic, cl.Partition, m.Offset, m.Key, m.Value,
		headersJSON(m.Headers), text(ex.err.Error()), ex.attempts, cl.Epoch); err != nil {
		return false, ctx.Err() != nil || transient(err, tx), fmt.Errorf("partition: park %s at offset %d: %w", cl, m.Offset, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, commitTransient(err), fmt.Errorf("partition: commit park %s at offset %d: %w", cl, m.Offset, err)
	}
	return true, false, nil
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

// text makes s storable as PostgreSQL text: valid UTF-8, no NUL bytes.
func text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// headersJSON is the parked headers column, as package inbox stores it: a
// JSON array of {"key", "value"} in order (repeated keys kept), a value
// that is not storable text given as "base64" instead.
func headersJSON(hs []kafka.Header) []byte {
	type header struct {
		Key    string `json:"key"`
		Value  string `json:"value,omitempty"`
		Base64 []byte `json:"base64,omitempty"`
	}
	out := make([]header, len(hs))
	for i, h := range hs {
		out[i].Key = text(h.Key)
		if v := string(h.Value); text(v) == v {
			out[i].Value = v
		} else {
			out[i].Base64 = h.Value
		}
	}
	b, _ := json.Marshal(out) // strings and bytes only: cannot fail
	return b
}

// apply runs one attempt of a batch: begin, fence, handler, commit. It
// reports whether a failure is transient: every failure before the
// handler runs is, BatchTimeout included; a timeout in the handler is not
// (the batch itself may be too slow); a commit whose outcome is unknown
// is (see commitTransient). The commit runs under pgerr.Commit: neither
// BatchTimeout nor the caller cancels it in flight. Its context carries the claim
// and lasts BatchTimeout; it does not end with the generation or with Run,
// so a batch in flight finishes instead of being cut off.
func (c *Consumer) apply(runCtx context.Context, cl Claim, prev *int64, next int64, msgs []kafka.Message) (retry bool, err error) {
	if c.beforeFence != nil {
		c.beforeFence(cl, msgs)
	}
	ctx, cancel := context.WithTimeout(context.WithValue(context.WithoutCancel(runCtx), claimKey{}, cl), c.cfg.BatchTimeout)
	defer cancel()
	// Until the handler runs, a failure says nothing about the batch: a
	// Begin or fence that ran out of BatchTimeout met an unreachable or
	// stalled PostgreSQL (or a row lock still held), which is waited out.
	tx, err := pgerr.Begin(ctx, c.db)
	if err != nil {
		return true, fmt.Errorf("partition: begin %s: %w", cl, err)
	}
	defer rollback(tx)
	outcome, err := c.checkFence(ctx, tx, cl, prev, next)
	if err != nil {
		return !errors.Is(err, ErrFenced) && (ctx.Err() != nil || transient(err, tx)), err
	}
	if outcome == fenceApplied {
		return false, nil
	}
	if err := callHandler(ctx, c.cfg.Handler, tx, msgs); err != nil {
		return handlerTransient(err, tx) && ctx.Err() == nil, fmt.Errorf("partition: handler on %s at offset %d: %w", cl, msgs[0].Offset, err)
	}
	if err := tx.Commit(ctx); err != nil {
		// A commit whose outcome is unknown (the connection failed, or
		// BatchTimeout ended the wait; the commit itself is never
		// cancelled) is retried, not counted: the next attempt's fence
		// waits for the row lock, so for the commit to end, and finds
		// the row at this batch's end if it committed. Until then the
		// batch is not done, and nothing is committed to Kafka for it.
		return commitTransient(err), fmt.Errorf("partition: commit %s at offset %d: %w", cl, msgs[0].Offset, err)
	}
	return false, nil
}

// PanicError is a Handler's panic that Run recovered. It counts toward
// MaxAttempts like any other handler error (never as transient): the batch
// rolls back, and when the attempts are used up the message is parked with
// it (OnPark receives it). The process lives on.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("partition: handler panicked: %v\n%s", e.Value, e.Stack)
}

// callHandler runs h, turning a panic into a *PanicError: the handler runs
// on a kafka-go goroutine, where an unrecovered panic ends the process.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, msgs []kafka.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
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

// release reports the end of a worker's ownership.
func (c *Consumer) release(cl Claim, err error, log *slog.Logger) {
	switch {
	case err == nil:
		log.Info("partition: released")
	case errors.Is(err, ErrFenced):
		log.Info("partition: fenced", "err", err)
	default:
		log.Warn("partition: worker stopped", "err", err)
	}
	if c.cfg.OnRelease != nil {
		c.cfg.OnRelease(cl, err)
	}
}
