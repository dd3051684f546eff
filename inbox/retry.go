package inbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/handlerpanic"
	"github.com/nolock/nolock/observe"
)

// PanicError is a handler's panic that Run recovered: the message counts
// as failed (and is parked after the attempts), the process lives on.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
}

// Error gives the panic's value, then the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("inbox: handler panicked: %v\n%s", e.Value, e.Stack)
}

func newPanicError(value any, stack []byte) error { return &PanicError{value, stack} }

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

// processBatch retries batch as a whole until it commits, a handler fails
// (isolate: go one by one), or ctx ends. A connection lost under the
// handler twice in a row isolates the batch too: one message may be what
// ends its connection every time, and one at a time it is counted and
// parked (see handleOne) instead of stalling its partition.
func (in *Inbox) processBatch(run, work context.Context, batch []kafka.Message, h Handler) (isolate bool, err error) {
	lost := 0
	for attempt := 1; ; attempt++ {
		_, err := in.Process(work, batch, h)
		var he *HandlerError
		var cl *connLostError
		switch {
		case err == nil:
			return false, nil
		case errors.As(err, &he) || errors.Is(err, ErrNoID):
			return true, nil
		case errors.As(err, &cl):
			if lost++; lost >= 2 {
				return true, nil
			}
		default:
			lost = 0
		}
		in.log.Warn("inbox: batch failed; retrying", "attempt", attempt, "err", err)
		delay := in.retry.Delay(attempt + 1)
		in.note(work, EventRetry, batch[0], false, observe.Event{N: int64(len(batch)), Attempt: attempt, Duration: delay, Err: err})
		if serr := backoff.Sleep(run, delay); serr != nil {
			return false, errfmt.Errorf("%w; last failure: %w", serr, err)
		}
	}
}

// handleOne processes m until it succeeds or is parked. Once it succeeds
// after counted failures, it drops their counter (best effort: Reap drops
// what is left).
func (in *Inbox) handleOne(run, work context.Context, m kafka.Message, h Handler) error {
	counted, lost := false, 0
	for attempt := 1; ; attempt++ {
		_, err := in.Process(work, []kafka.Message{m}, h)
		var he *HandlerError
		var cl *connLostError
		if errors.As(err, &cl) {
			// Once, the database's trouble; every time on this message
			// (it ends its own backend, or idles past the server's
			// timeout), the message's: counted, so it can be parked.
			if lost++; lost > in.attempts {
				he = &HandlerError{Msg: m, Err: cl.error}
				err = he
			}
		}
		switch {
		case err == nil:
			if id, _ := in.id(m); counted {
				ctx, cancel := context.WithTimeout(work, in.batchTimeout)
				defer cancel()
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
			parked, ferr := in.fail(work, m, cause)
			counted = counted || ferr == nil
			if ferr != nil {
				err = ferr // the database is in trouble: back off below
				in.log.Warn("inbox: counting a failed attempt failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
			} else if parked {
				return nil
			}
		default:
			in.log.Warn("inbox: message failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
		}
		if serr := backoff.Sleep(run, in.retry.Delay(attempt+1)); serr != nil {
			return errfmt.Errorf("%w; last failure: %w", serr, err)
		}
	}
}
