package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/handlerfail"
	"github.com/nolock/nolock/internal/handlerpanic"
	"github.com/nolock/nolock/observe"
)

// recovering turns a panic of h into a *PanicError, so that one poison
// message makes Run park it rather than crash the process on every
// redelivery.
func recovering(h Handler) Handler {
	return func(ctx context.Context, tx pgx.Tx, m kafka.Message) (err error) {
		defer handlerpanic.Recover(&err, newPanicError)
		return h(ctx, tx, m)
	}
}

// handle processes batch in one transaction; when a handler fails, it
// processes the messages one by one so a poison message is isolated. Other
// failures (the database unreachable, a commit whose outcome is unknown)
// are retried with backoff: the inbox makes a retry of a batch that did
// commit a no-op. Each attempt runs under work, bounded by the batch
// timeout; once run ends, nothing is tried again and handle returns its
// error.
func (in *Inbox) handle(run, work context.Context, batch []kafka.Message, h Handler) error {
	if len(batch) > 1 {
		isolate, err := in.processBatch(run, work, batch, h)
		if err != nil || !isolate {
			return err
		}
	}
	for _, m := range batch {
		if err := in.handleOne(run, work, m, h); err != nil {
			return err
		}
	}
	return nil
}

// processBatch retries batch as a whole until it commits, a handler's
// failure counts (isolate: go one by one), or run ends. A failure that is
// the database's trouble under the handler (a deadlock, a lost
// connection) is retried without counting while it came at most the
// attempts in a row: one message may be what causes it every time, and
// one at a time it is counted and parked (see handleOne) instead of
// stalling its partition.
func (in *Inbox) processBatch(run, work context.Context, batch []kafka.Message, h Handler) (isolate bool, err error) {
	tally := handlerfail.Tally{Bound: in.attempts}
	for attempt := 1; ; attempt++ {
		_, err := in.Process(work, batch, h)
		if err == nil {
			return false, nil
		}
		if kind, _, ok := failureOf(err); ok && tally.Counts(kind) {
			return true, nil
		}
		in.log.Warn("inbox: batch failed; retrying", "attempt", attempt, "err", err)
		delay := in.retry.Delay(attempt + 1)
		in.note(work, EventRetry, batch[0], false, observe.Event{N: int64(len(batch)), Attempt: attempt, Duration: delay, Err: err})
		if serr := backoff.Sleep(run, delay); serr != nil {
			return false, errfmt.Errorf("%w; last failure: %w", serr, err)
		}
	}
}

// handleOne processes m until it succeeds or is parked. A failure that
// counts (see processBatch) is counted in the attempts table, which parks
// m once the attempts ran out; a Permanent one, or a message without
// identity, parks at once. Once m succeeds after counted failures, it
// drops their counter (best effort: Reap drops what is left).
func (in *Inbox) handleOne(run, work context.Context, m kafka.Message, h Handler) error {
	counted := false
	tally := handlerfail.Tally{Bound: in.attempts}
	for attempt := 1; ; attempt++ {
		_, err := in.Process(work, []kafka.Message{m}, h)
		if err == nil {
			if id, _ := in.id(m); counted {
				ctx, cancel := context.WithTimeout(work, in.batchTimeout)
				defer cancel()
				if _, err := in.db.Exec(ctx, in.clearSQL, in.over.Args(in.consumer, id)...); err != nil {
					in.log.Warn("inbox: clearing an attempt counter failed", "err", err)
				}
			}
			return nil
		}
		if kind, cause, ok := failureOf(err); ok && tally.Counts(kind) {
			parked, ferr := in.fail(work, m, cause, kind == handlerfail.Permanent)
			counted = counted || ferr == nil
			if ferr != nil {
				err = ferr // the database is in trouble: back off below
				in.log.Warn("inbox: counting a failed attempt failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
			} else if parked {
				return nil
			}
		} else {
			in.log.Warn("inbox: message failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
		}
		if serr := backoff.Sleep(run, in.retry.Delay(attempt+1)); serr != nil {
			return errfmt.Errorf("%w; last failure: %w", serr, err)
		}
	}
}

// failureOf tells a failure of Process on the handler's side (ok) from the
// database's outside it, which is retried uncounted for as long as Run
// lasts: its kind, and the cause to count and park the message with. A
// message without identity parks at once.
func failureOf(err error) (kind handlerfail.Kind, cause error, ok bool) {
	var he *HandlerError
	var cl *connLostError
	switch {
	case errors.As(err, &he):
		return he.kind, he.Err, true
	case errors.As(err, &cl):
		return handlerfail.Database, cl.error, true
	case errors.Is(err, ErrNoID):
		return handlerfail.Permanent, err, true
	}
	return 0, nil, false
}
