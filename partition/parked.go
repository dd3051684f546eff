package partition

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/pgerr"
)

// ErrNotParked means the Consumer's group has no parked message at the
// given position: it never was parked, or it was replayed or purged since.
var ErrNotParked = errors.New("partition: no such parked message")

// ErrAmbiguousCommit means a replay's COMMIT was sent and the connection
// then failed: it may or may not have committed. Replaying again is safe:
// it either applies the message or reports ErrNotParked.
var ErrAmbiguousCommit = errors.New("partition: commit outcome unknown")

// ParkedID names a parked message: its position in Kafka. The Consumer's
// group completes the key. inbox.ParkedID is the same position, in the
// same text.
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
	// Msg holds what was stored of the message: Topic, Partition, Offset,
	// Key, Value and Headers, in order. A header key that was not valid
	// UTF-8 was stored with U+FFFD in place of its bad bytes; Time and the
	// other fields are not stored.
	Msg kafka.Message
	// Error is the text of the last failed attempt's error, replays
	// included; Attempts counts the failed attempts, replays included.
	Error    string
	Attempts int
	// Epoch is the claim under which the message was parked.
	Epoch int64
	// ParkedAt is when the message was parked, by the database's clock.
	ParkedAt time.Time
}

func parkedOf(r kafkapark.Row) Parked {
	return Parked{ID: ParkedID(r.ID), Msg: r.Msg, Error: r.Error, Attempts: r.Attempts, Epoch: r.Epoch, ParkedAt: r.ParkedAt}
}

// ListParked returns up to limit of the group's parked messages whose
// position sorts after after (the zero ParkedID for the first page), in
// (topic, partition, offset) order: pass the last one's ID to get the next
// page. It reads a snapshot; it locks nothing, and does no Kafka I/O.
func (c *Consumer) ListParked(ctx context.Context, after ParkedID, limit int) ([]Parked, error) {
	if ctx == nil {
		return nil, invalid("ctx is nil")
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
		tx, err := c.pg.Begin(ctx, c.db)
		if err != nil {
			return errfmt.Errorf("begin: %w", err)
		}
		defer rollback(tx)
		rows, err = c.parked.List(ctx, tx, c.cfg.GroupID, kafkapark.ID(after), limit)
		return err
	})
	if err != nil {
		return nil, errfmt.Errorf("partition: list parked: %w", err)
	}
	out := make([]Parked, len(rows))
	for i, r := range rows {
		out[i] = parkedOf(r)
	}
	return out, nil
}

// ReplayParked runs h on the parked message id, alone, in one transaction
// that takes the message off the parked table with h's effect: they commit
// together or not at all. So a parked message is applied at most once by
// replays, however many run at once: a concurrent replay of the same id
// waits for this one's transaction and then, if it committed, returns
// ErrNotParked.
//
// The transaction first takes the partition's row lock, so the replay runs
// between the partition owner's batches, never beside one (it may wait for
// the batch in flight). It is the operator's write, not the owner's: it
// does not check or change the epoch or the stored offset, and it applies
// the message after the partition's later messages, out of offset order.
// The transaction is bounded as a batch is (WithBatchTimeout: h's ctx ends
// then, and the server ends a transaction left idle that long); h's ctx
// carries no Claim (FromContext reports false). ReplayParked does no
// Kafka I/O.
//
// If h fails (or panics: a *PanicError), nothing of the replay commits,
// the message stays parked with its Error set to h's and its Attempts
// counted, and the error returned is a *HandlerError wrapping h's. A
// commit whose outcome is unknown returns ErrAmbiguousCommit: replay
// again, which either applies it or reports ErrNotParked. An unknown id is
// ErrNotParked; a nil ctx or h, or an id no message can have (empty topic,
// negative partition or offset) is ErrInvalid, before any I/O.
func (c *Consumer) ReplayParked(ctx context.Context, id ParkedID, h Handler) error {
	switch {
	case ctx == nil:
		return invalid("ctx is nil")
	case h == nil:
		return invalid("handler is nil")
	}
	if err := id.check("id"); err != nil {
		return err
	}
	err := kafkapark.Again(func() error { return c.replay(ctx, id, h) })
	var he *HandlerError
	if !errors.As(err, &he) {
		return err
	}
	// The replay rolled back: the message is still parked. Say why there.
	ferr := c.inTx(ctx, func(tx pgx.Tx) error { return c.parked.Failed(ctx, tx, c.cfg.GroupID, kafkapark.ID(id), he.Err) })
	if ferr != nil {
		return errfmt.Errorf("%w (recording the failure: %w)", he, ferr)
	}
	return he
}

// replay runs one replay transaction; a Handler's failure is a
// *HandlerError.
func (c *Consumer) replay(ctx context.Context, id ParkedID, h Handler) error {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	tx, err := c.pg.Begin(tctx, c.db)
	if err != nil {
		return errfmt.Errorf("partition: replay %s: begin: %w", id, err)
	}
	defer rollback(tx)
	if _, err := tx.Exec(tctx, c.sql.replayLock, c.cfg.GroupID, id.Topic, id.Partition, c.idleTimeout); err != nil {
		return errfmt.Errorf("partition: replay %s: lock the partition: %w", id, err)
	}
	r, err := c.parked.Take(tctx, tx, c.cfg.GroupID, kafkapark.ID(id))
	switch {
	case errors.Is(err, kafkapark.ErrNotParked):
		return errfmt.Errorf("partition: replay %s: %w", id, ErrNotParked)
	case err != nil:
		return errfmt.Errorf("partition: replay %s: %w", id, err)
	}
	msgs := []kafka.Message{r.Msg}
	if err := callHandler(tctx, h, tx.Handed(), msgs); err != nil {
		tx.Learn(err)
		return &HandlerError{Msg: r.Msg, Err: err}
	}
	if err := tx.Commit(tctx); err != nil {
		if pgerr.Ambiguous(err) {
			return errfmt.Errorf("partition: replay %s: %w: %w", id, ErrAmbiguousCommit, err)
		}
		return errfmt.Errorf("partition: replay %s: commit: %w", id, err)
	}
	return nil
}

// PurgeParked deletes the parked message id without applying it. It
// returns ErrNotParked if there is none (purged or replayed meanwhile). A
// purge waits for a replay of the same id in flight, so a message is
// never both replayed and purged.
func (c *Consumer) PurgeParked(ctx context.Context, id ParkedID) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	if err := id.check("id"); err != nil {
		return err
	}
	var found bool
	err := kafkapark.Again(func() error {
		return c.inTx(ctx, func(tx pgx.Tx) (err error) {
			found, err = c.parked.Purge(ctx, tx, c.cfg.GroupID, kafkapark.ID(id))
			return err
		})
	})
	switch {
	case err != nil:
		return errfmt.Errorf("partition: purge parked %s: %w", id, err)
	case !found:
		return errfmt.Errorf("partition: purge parked %s: %w", id, ErrNotParked)
	}
	return nil
}

// PurgeParkedOlderThan deletes the group's messages parked longer ago than
// retention (by the database's clock), without applying them, and returns
// how many it deleted. It is the parked table's retention: nothing purges
// parked messages by itself, so schedule it (e.g. daily) with the time
// operators have to act.
//
// It deletes at most batch rows per statement, each in a transaction of
// its own, until none is left: writers never wait long behind it. A
// message being replayed meanwhile is skipped, not waited for. Cancelling
// ctx stops it between batches; what was deleted stays deleted, and is
// counted in the total returned with the error.
func (c *Consumer) PurgeParkedOlderThan(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if ctx == nil {
		return 0, invalid("ctx is nil")
	}
	switch {
	case retention <= 0:
		return 0, invalid("retention %v is not positive", retention)
	case batch < 1:
		return 0, invalid("batch %d is below 1", batch)
	}
	n, err := kafkapark.Batches(ctx, batch, func() (n int64, err error) {
		err = kafkapark.Again(func() error {
			return c.inTx(ctx, func(tx pgx.Tx) (err error) {
				n, err = c.parked.PurgeOlder(ctx, tx, c.cfg.GroupID, retention, batch)
				return err
			})
		})
		return n, err
	})
	if err != nil {
		return n, errfmt.Errorf("partition: purge parked: %w", err)
	}
	return n, nil
}

// inTx runs f in a transaction of its own and commits; an unknown commit
// outcome wraps ErrAmbiguousCommit.
func (c *Consumer) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	tx, err := c.pg.Begin(ctx, c.db)
	if err != nil {
		return errfmt.Errorf("begin: %w", err)
	}
	defer rollback(tx)
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.Ambiguous(err) {
			return errfmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
		}
		return errfmt.Errorf("commit: %w", err)
	}
	return nil
}

// check refuses a position no message can have.
func (id ParkedID) check(name string) error {
	if err := kafkapark.ID(id).Check(); err != nil {
		return invalid("%s: %v", name, err)
	}
	return nil
}
