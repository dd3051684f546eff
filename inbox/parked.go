package inbox

import (
	"context"
	"errors"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
)

// ErrNotParked means no parked message of this Inbox's consumer has the
// given id: it never was parked, or it was replayed or purged since.
var ErrNotParked = errors.New("inbox: no such parked message")

// ParkedID names a parked message: its position in Kafka. The Inbox's
// consumer completes the key. partition.ParkedID is the same position, in
// the same text.
type ParkedID struct {
	Topic     string
	Partition int
	Offset    int64
}

// String is "topic/partition@offset", the Key of EventParked; ParseParkedID
// reads it back.
func (id ParkedID) String() string { return kafkapark.ID(id).String() }

// ParseParkedID reads a ParkedID from its String, for an operator's
// command: "topic/partition@offset" with a non-empty topic and decimal,
// non-negative numbers. Anything else is ErrInvalid.
func ParseParkedID(s string) (ParkedID, error) {
	id, err := kafkapark.Parse(s)
	if err != nil {
		return ParkedID{}, invalid("parked id: %v", err)
	}
	return ParkedID(id), nil
}

// Parked is a parked message as stored in the parked table.
type Parked struct {
	// ID is the message's position: what ReplayParked and PurgeParked
	// take.
	ID ParkedID
	// MessageID is the message's identity (WithIdentity), recorded as
	// processed when it was parked and again by its replay; a message
	// without one is known by ByOffset's "topic/partition/offset", and
	// under ByWatermark it is empty.
	MessageID string
	// Msg holds what was stored of the message: Topic, Partition, Offset,
	// Key, Value and Headers, in order. A header key that was not valid
	// UTF-8 was stored with U+FFFD in place of its bad bytes; Time and the
	// other fields are not stored.
	Msg kafka.Message
	// Error is the text of the last failed attempt's error, replays
	// included; Attempts counts the failed attempts, replays included.
	Error    string
	Attempts int
	// ParkedAt is when the message was parked, by the database's clock.
	ParkedAt time.Time
}

func parkedOf(r kafkapark.Row) Parked {
	return Parked{ID: ParkedID(r.ID), MessageID: r.MessageID, Msg: r.Msg, Error: r.Error, Attempts: r.Attempts, ParkedAt: r.ParkedAt}
}

// ListParked returns up to limit of this Inbox's consumer's parked
// messages whose position sorts after after (the zero ParkedID for the
// first page), in (topic, partition, offset) order: pass the last one's ID
// to get the next page. It reads a snapshot; it locks nothing.
func (in *Inbox) ListParked(ctx context.Context, after ParkedID, limit int) ([]Parked, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, invalid("limit %d is below 1", limit)
	}
	if after != (ParkedID{}) {
		if err := after.check("after"); err != nil {
			return nil, err
		}
	}
	var rows []kafkapark.Row
	err := kafkapark.Again(func() error {
		tx, err := in.pg.Begin(ctx, in.db)
		if err != nil {
			return errfmt.Errorf("begin: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		rows, err = in.parked.List(ctx, tx, in.consumer, kafkapark.ID(after), limit)
		return err
	})
	if err != nil {
		return nil, errfmt.Errorf("inbox: list parked: %w", err)
	}
	out := make([]Parked, len(rows))
	for i, r := range rows {
		out[i] = parkedOf(r)
	}
	return out, nil
}

// ReplayParked runs h on the parked message id, in one transaction that
// takes the message off the parked table and records it as processed
// (again, should Reap have dropped the record), with h's effect: they
// commit together or not at all. So a parked message is applied at most
// once by replays, however many run at once: a concurrent replay of the
// same id waits for this one's transaction and then, if it committed,
// returns ErrNotParked. The transaction is bounded as a batch is
// (WithBatchTimeout: h's ctx ends then, and PostgreSQL ends a session left
// idle in the transaction that long).
//
// If h fails (or panics: a *PanicError), nothing of the replay commits,
// the message stays parked with its Error set to h's and its Attempts
// counted, and the error returned is a *HandlerError wrapping h's. A
// commit whose outcome is unknown returns ErrAmbiguousCommit: replay
// again, which either applies it or reports ErrNotParked. An unknown id is
// ErrNotParked; a nil ctx or h, or an id no message can have (empty topic,
// negative partition or offset) is ErrInvalid, before any I/O. A replayed
// message is applied out of its partition's order, after the messages
// that followed it.
func (in *Inbox) ReplayParked(ctx context.Context, id ParkedID, h Handler) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if h == nil {
		return invalid("handler is nil")
	}
	if err := id.check("id"); err != nil {
		return err
	}
	run := recovering(h)
	tctx, cancel := context.WithTimeout(ctx, in.batchTimeout)
	defer cancel()
	err := kafkapark.Again(func() error {
		return in.inTx(tctx, func(tx *pgerr.Tx) error {
			if _, err := tx.Exec(tctx, in.idleSQL, in.idleTimeout); err != nil {
				return errfmt.Errorf("inbox: replay %s: %w", id, err)
			}
			r, err := in.parked.Take(tctx, tx, in.consumer, kafkapark.ID(id))
			switch {
			case errors.Is(err, kafkapark.ErrNotParked):
				return errfmt.Errorf("inbox: replay %s: %w", id, ErrNotParked)
			case err != nil:
				return errfmt.Errorf("inbox: replay %s: %w", id, err)
			}
			if r.MessageID != "" && !in.identity.watermark {
				if _, err := tx.Exec(tctx, in.recordSQL, in.consumer, r.MessageID); err != nil {
					return errfmt.Errorf("inbox: replay %s: record: %w", id, err)
				}
			}
			if err := in.runHandler(tctx, run, tx.Handed(), r.Msg); err != nil {
				tx.Learn(err)
				return &HandlerError{Msg: r.Msg, Err: err}
			}
			return nil
		})
	})
	if err == nil {
		in.counts.processed.Add(1)
		return nil
	}
	var he *HandlerError
	if !errors.As(err, &he) {
		return err
	}
	// The replay rolled back: the message is still parked. Say why there.
	ferr := in.inTx(ctx, func(tx *pgerr.Tx) error { return in.parked.Failed(ctx, tx, in.consumer, kafkapark.ID(id), he.Err) })
	if ferr != nil {
		return errfmt.Errorf("%w (recording the failure: %w)", he, ferr)
	}
	return he
}

// PurgeParked deletes the parked message id without applying it. It
// returns ErrNotParked if there is none (purged or replayed meanwhile). A
// purge waits for a replay of the same id in flight, so a message is
// never both replayed and purged.
func (in *Inbox) PurgeParked(ctx context.Context, id ParkedID) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := id.check("id"); err != nil {
		return err
	}
	var found bool
	err := kafkapark.Again(func() error {
		return in.inTx(ctx, func(tx *pgerr.Tx) (err error) {
			found, err = in.parked.Purge(ctx, tx, in.consumer, kafkapark.ID(id))
			return err
		})
	})
	switch {
	case err != nil:
		return errfmt.Errorf("inbox: purge parked %s: %w", id, err)
	case !found:
		return errfmt.Errorf("inbox: purge parked %s: %w", id, ErrNotParked)
	}
	return nil
}

// PurgeParkedOlderThan deletes this Inbox's consumer's messages parked
// longer ago than retention (by the database's clock), without applying
// them, and returns how many it deleted. It is the parked table's
// retention: nothing purges parked messages by itself, so schedule it
// (e.g. daily, beside Reap) with the time operators have to act.
//
// It deletes at most batch rows per statement, each in a transaction of
// its own, until none is left: writers never wait long behind it. A
// message being replayed meanwhile is skipped, not waited for. Cancelling
// ctx stops it between batches; what was deleted stays deleted, and is
// counted in the total returned with the error.
func (in *Inbox) PurgeParkedOlderThan(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	switch {
	case retention <= 0:
		return 0, invalid("retention %v is not positive", retention)
	case batch < 1:
		return 0, invalid("batch %d is below 1", batch)
	}
	n, err := kafkapark.Batches(ctx, batch, func() (n int64, err error) {
		err = kafkapark.Again(func() error {
			return in.inTx(ctx, func(tx *pgerr.Tx) (err error) {
				n, err = in.parked.PurgeOlder(ctx, tx, in.consumer, retention, batch)
				return err
			})
		})
		return n, err
	})
	if err != nil {
		return n, errfmt.Errorf("inbox: purge parked: %w", err)
	}
	return n, nil
}

// check refuses a position no message can have.
func (id ParkedID) check(name string) error {
	if err := kafkapark.ID(id).Check(); err != nil {
		return invalid("%s: %v", name, err)
	}
	return nil
}
