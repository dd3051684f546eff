package inbox

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/handlerfail"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// Outcome says what Process did with each message.
type Outcome struct {
	Processed  int // effects applied and recorded in this call
	Duplicates int // messages recorded earlier (or twice in the batch): skipped
}

// Process records msgs and runs h for each new one, in order, all in ONE
// transaction: either every new message's effect and record commit, or
// none does. The transaction is bounded by the batch timeout
// (WithBatchTimeout): h's ctx ends then, and PostgreSQL ends a session
// left idle in the transaction that long; h's failure to finish in time is
// a *HandlerError. A message already recorded is skipped and counted as a
// duplicate. On a handler error the transaction rolls back and the error
// is returned as a *HandlerError (with the message's position); nothing is
// recorded, so the batch can be retried. A handler error on a connection
// that died meanwhile is the database's, not the message's: it is not a
// *HandlerError. Process does not retry, count attempts or park: Run does.
func (in *Inbox) Process(ctx context.Context, msgs []kafka.Message, h Handler) (Outcome, error) {
	if err := checkCtx(ctx); err != nil {
		return Outcome{}, err
	}
	if h == nil {
		return Outcome{}, invalid("handler is nil")
	}
	if len(msgs) == 0 {
		return Outcome{}, nil
	}
	ids := make([]string, len(msgs))
	if !in.identity.watermark {
		for i, m := range msgs {
			id, err := in.id(m)
			if err != nil {
				return Outcome{}, errfmt.Errorf("inbox: message %d (%s/%d@%d): %w", i, m.Topic, m.Partition, m.Offset, err)
			}
			ids[i] = id
		}
	}
	var out Outcome
	start := time.Now()
	bctx, cancel := context.WithTimeout(ctx, in.batchTimeout)
	defer cancel()
	err := in.inTx(bctx, func(tx *pgerr.Tx) error {
		out = Outcome{}
		fresh, err := in.claim(bctx, tx, msgs, ids)
		if err != nil {
			return err
		}
		for i, m := range msgs {
			if !fresh[i] {
				out.Duplicates++
				continue
			}
			if err := in.runHandler(bctx, h, tx.Handed(), m); err != nil {
				tx.Learn(err)
				expired := bctx.Err() != nil
				if tx.Conn().IsClosed() && !expired && !ownDeadline(bctx, err) {
					// The connection died under the handler: the
					// database's trouble, not the message's.
					return &connLostError{errfmt.Errorf("inbox: message %d (%s/%d@%d): connection lost: %w", i, m.Topic, m.Partition, m.Offset, err)}
				}
				return &HandlerError{Msg: m, Index: i, Err: err, kind: handlerfail.Classify(err, false, expired)}
			}
			out.Processed++
		}
		return nil
	})
	if err != nil {
		return Outcome{}, err
	}
	in.counts.processed.Add(int64(out.Processed))
	in.counts.handled(msgs...)
	if out.Duplicates > 0 {
		in.counts.duplicates.Add(int64(out.Duplicates))
		last := msgs[len(msgs)-1]
		in.log.Info("inbox: skipped messages whose identity was recorded before (redelivered, resent, or an id another topic of this consumer name used)",
			"consumer", in.consumer, "duplicates", out.Duplicates, "of", len(msgs),
			"first", kafkapark.EventKey(msgs[0].Topic, msgs[0].Partition, msgs[0].Offset), "last", kafkapark.EventKey(last.Topic, last.Partition, last.Offset))
	}
	if out.Processed > 0 {
		in.note(ctx, EventCommitted, msgs[0], false, observe.Event{N: int64(out.Processed), Duration: time.Since(start)})
	}
	if out.Duplicates > 0 {
		in.note(ctx, EventDuplicate, msgs[0], false, observe.Event{N: int64(out.Duplicates)})
	}
	return out, nil
}

// claim marks which of msgs are new, recording them in tx.
func (in *Inbox) claim(ctx context.Context, tx pgx.Tx, msgs []kafka.Message, ids []string) ([]bool, error) {
	fresh := make([]bool, len(msgs))
	if in.identity.watermark {
		return fresh, in.claimWatermarks(ctx, tx, msgs, fresh)
	}
	rows, err := tx.Query(ctx, in.claimSQL, in.consumer, ids, in.idleTimeout)
	if err != nil {
		return nil, errfmt.Errorf("inbox: claim: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, errfmt.Errorf("inbox: claim: %w", err)
	}
	isNew := make(map[string]bool, len(inserted))
	for _, id := range inserted {
		isNew[id] = true
	}
	for i, id := range ids {
		fresh[i] = isNew[id]
		isNew[id] = false // a repeat within the batch is a duplicate
	}
	return fresh, nil
}

// claimWatermarks locks each partition's watermark (in a fixed order, so
// concurrent batches cannot deadlock), marks messages at or above it as new
// and moves it past the batch.
func (in *Inbox) claimWatermarks(ctx context.Context, tx pgx.Tx, msgs []kafka.Message, fresh []bool) error {
	type tp struct {
		topic     string
		partition int
	}
	var order []tp
	last := map[tp]int64{}
	for _, m := range msgs {
		k := tp{m.Topic, m.Partition}
		if _, ok := last[k]; !ok {
			order = append(order, k)
		}
		last[k] = max(last[k], m.Offset)
	}
	slices.SortFunc(order, func(a, b tp) int {
		return cmp.Or(strings.Compare(a.topic, b.topic), cmp.Compare(a.partition, b.partition))
	})
	next := map[tp]int64{}
	for _, k := range order {
		if _, err := tx.Exec(ctx, in.wmInitSQL, in.consumer, k.topic, k.partition, in.idleTimeout); err != nil {
			return errfmt.Errorf("inbox: watermark: %w", err)
		}
		var n int64
		if err := tx.QueryRow(ctx, in.wmLockSQL, in.consumer, k.topic, k.partition).Scan(&n); err != nil {
			return errfmt.Errorf("inbox: watermark: %w", err)
		}
		next[k] = n
	}
	for i, m := range msgs {
		k := tp{m.Topic, m.Partition}
		if m.Offset >= next[k] {
			fresh[i] = true
			next[k] = m.Offset + 1
		}
	}
	for _, k := range order {
		if _, err := tx.Exec(ctx, in.wmSetSQL, in.consumer, k.topic, k.partition, next[k]); err != nil {
			return errfmt.Errorf("inbox: watermark: %w", err)
		}
	}
	return nil
}

// inTx runs f in a transaction and commits, reporting an unknown commit
// outcome as ErrAmbiguousCommit. The commit is never cancelled by ctx: it
// runs on to its end, and Close waits for it (see pgerr.Committer).
func (in *Inbox) inTx(ctx context.Context, f func(*pgerr.Tx) error) error {
	tx, err := in.pg.Begin(ctx, in.db)
	if err != nil {
		return errfmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.Ambiguous(err) {
			return errfmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
		}
		return errfmt.Errorf("inbox: commit: %w", err)
	}
	return nil
}

// connLostError is a handler error on a connection that died under it:
// the database's trouble, not counted as the message's attempt (Run
// counts it only when it keeps happening on one message).
type connLostError struct{ error }

func (e *connLostError) Unwrap() error { return e.error }

// ownDeadline reports whether the handler's err is its own context's
// deadline or cancellation, ctx (Process's) still being live: pgx closes a
// connection whose query's context ends, but that is the handler's
// failure, not the database's.
func ownDeadline(ctx context.Context, err error) bool {
	return ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled))
}
