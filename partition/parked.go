package partition

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

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
// GroupID completes the key.
type ParkedID struct {
	Topic     string
	Partition int
	Offset    int64
}

// String is "topic/partition@offset".
func (id ParkedID) String() string { return fmt.Sprintf("%s/%d@%d", id.Topic, id.Partition, id.Offset) }

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

// parkedStatements is the SQL of the operator's calls on parked messages.
type parkedStatements struct {
	list, lock, take, failed, purge, purgeOlder string
}

func newParkedStatements(table string) parkedStatements {
	t := pgx.Identifier{table}.Sanitize()
	parked := pgx.Identifier{table + parkedSuffix}.Sanitize()
	const key = `group_id = $1 AND topic = $2 AND partition_id = $3`
	const cols = `topic, partition_id, "offset", key, value, headers, error, attempts, epoch, parked_at`
	return parkedStatements{
		list: `SELECT ` + cols + ` FROM ` + parked + `
WHERE group_id = $1 AND (topic, partition_id, "offset") > ($2, $3, $4)
ORDER BY topic, partition_id, "offset" LIMIT $5`,
		// lock takes the partition's row lock, as a batch's fence and a
		// claim do, so a replay runs between the owner's batches, never
		// beside one: the partition keeps one writer at a time. It also
		// sets the frozen-owner timeout, as they do.
		lock: idle + `SELECT 1 FROM ` + t + ` AS p, idle WHERE ` + key + ` FOR NO KEY UPDATE OF p`,
		// take deletes the row, holding its lock until the replay ends.
		take:       `DELETE FROM ` + parked + ` WHERE ` + key + ` AND "offset" = $4 RETURNING ` + cols,
		failed:     `UPDATE ` + parked + ` SET error = $5, attempts = attempts + 1 WHERE ` + key + ` AND "offset" = $4`,
		purge:      `DELETE FROM ` + parked + ` WHERE ` + key + ` AND "offset" = $4`,
		purgeOlder: `DELETE FROM ` + parked + ` WHERE group_id = $1 AND parked_at < now() - $2::interval`,
	}
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
	tx, err := c.pg.Begin(ctx, c.db)
	if err != nil {
		return nil, errfmt.Errorf("partition: list parked: begin: %w", err)
	}
	defer rollback(tx)
	rows, err := tx.Query(ctx, c.parked.list, c.cfg.GroupID, after.Topic, after.Partition, after.Offset, limit)
	if err != nil {
		return nil, errfmt.Errorf("partition: list parked: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, errfmt.Errorf("partition: list parked: %w", err)
	}
	return out, nil
}

// ReplayParked runs h on the parked message id, alone, in one transaction
// that takes the message off the parked table with h's effect: they commit together or not at all. So a parked
// message is applied at most once by replays, however many run at once: a
// concurrent replay of the same id waits for this one's transaction and
// then, if it committed, returns ErrNotParked.
//
// The transaction first takes the partition's row lock, so the replay runs
// between the partition owner's batches, never beside one (it may wait for
// the batch in flight). It is the operator's write, not the owner's: it
// does not check or change the epoch or the stored offset, and it applies
// the message after the partition's later messages, out of offset order.
// h's ctx is ctx bounded by the batch timeout and carries no Claim
// (FromContext reports false). ReplayParked does no Kafka I/O.
//
// If h fails (or panics: a *PanicError), nothing of the replay commits,
// the message stays parked with its Error set to h's and its Attempts
// counted, and the returned error wraps h's. A commit whose outcome is
// unknown returns ErrAmbiguousCommit. An unknown id is ErrNotParked; a nil
// ctx or h, or an id no message can have (empty topic, negative partition
// or offset) is ErrInvalid, before any I/O.
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
	p, err := c.replay(ctx, id, h)
	if err == nil || p == nil {
		return err
	}
	// The replay rolled back: the message is still parked. Say why there.
	if ferr := c.recordReplayFailure(ctx, id, err); ferr != nil {
		return errfmt.Errorf("%w (recording the failure: %w)", err, ferr)
	}
	return err
}

// replay runs one replay transaction. It returns the parked message with
// the error when the Handler failed, and nil with any other error.
func (c *Consumer) replay(ctx context.Context, id ParkedID, h Handler) (*Parked, error) {
	tctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	tx, err := c.pg.Begin(tctx, c.db)
	if err != nil {
		return nil, errfmt.Errorf("partition: replay %s: begin: %w", id, err)
	}
	defer rollback(tx)
	if _, err := tx.Exec(tctx, c.parked.lock, c.cfg.GroupID, id.Topic, id.Partition, c.idleTimeout); err != nil {
		return nil, errfmt.Errorf("partition: replay %s: lock the partition: %w", id, err)
	}
	rows, err := tx.Query(tctx, c.parked.take, c.cfg.GroupID, id.Topic, id.Partition, id.Offset)
	if err != nil {
		return nil, errfmt.Errorf("partition: replay %s: %w", id, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, errfmt.Errorf("partition: replay %s: %w", id, ErrNotParked)
	case err != nil:
		return nil, errfmt.Errorf("partition: replay %s: %w", id, err)
	}
	if err := callHandler(tctx, h, tx.Handed(), []kafka.Message{p.Msg}); err != nil {
		tx.Learn(err)
		return &p, errfmt.Errorf("partition: replay %s: handler: %w", id, err)
	}
	if err := tx.Commit(tctx); err != nil {
		if pgerr.Ambiguous(err) {
			return nil, errfmt.Errorf("partition: replay %s: %w: %w", id, ErrAmbiguousCommit, err)
		}
		return nil, errfmt.Errorf("partition: replay %s: commit: %w", id, err)
	}
	return nil, nil
}

// recordReplayFailure stores a failed replay's error and counts it as an
// attempt, on the row it left parked.
func (c *Consumer) recordReplayFailure(ctx context.Context, id ParkedID, cause error) error {
	err := c.inTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, c.parked.failed, c.cfg.GroupID, id.Topic, id.Partition, id.Offset, kafkapark.Text(cause.Error()))
		return err
	})
	if err != nil {
		return errfmt.Errorf("partition: replay %s: recording the failure: %w", id, err)
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
	var n int64
	err := c.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, c.parked.purge, c.cfg.GroupID, id.Topic, id.Partition, id.Offset)
		n = tag.RowsAffected()
		return err
	})
	switch {
	case err != nil:
		return errfmt.Errorf("partition: purge parked %s: %w", id, err)
	case n == 0:
		return errfmt.Errorf("partition: purge parked %s: %w", id, ErrNotParked)
	}
	return nil
}

// PurgeParkedOlderThan deletes the group's messages parked longer ago than
// retention (by the database's clock), without applying them, and returns
// how many it deleted. It is the parked table's retention: nothing purges
// parked messages by itself, so schedule it (e.g. daily) with the time
// operators have to act.
func (c *Consumer) PurgeParkedOlderThan(ctx context.Context, retention time.Duration) (int64, error) {
	if ctx == nil {
		return 0, invalid("ctx is nil")
	}
	if retention <= 0 {
		return 0, invalid("retention %v is not positive", retention)
	}
	iv := fmt.Sprintf("%d microseconds", retention.Microseconds())
	var n int64
	err := c.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, c.parked.purgeOlder, c.cfg.GroupID, iv)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, errfmt.Errorf("partition: purge parked: %w", err)
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
	switch {
	case id.Topic == "":
		return invalid("%s: topic is empty", name)
	case !utf8.ValidString(id.Topic) || strings.IndexByte(id.Topic, 0) >= 0:
		return invalid("%s: topic %q is not UTF-8 without NUL", name, id.Topic)
	case id.Partition < 0:
		return invalid("%s: partition %d is negative", name, id.Partition)
	case id.Offset < 0:
		return invalid("%s: offset %d is negative", name, id.Offset)
	}
	return nil
}

// scanParked reads one parked row.
func scanParked(row pgx.CollectableRow) (Parked, error) {
	var p Parked
	var headers []byte
	err := row.Scan(&p.Msg.Topic, &p.Msg.Partition, &p.Msg.Offset, &p.Msg.Key, &p.Msg.Value,
		&headers, &p.Error, &p.Attempts, &p.Epoch, &p.ParkedAt)
	if err != nil {
		return Parked{}, err
	}
	p.ID = ParkedID{Topic: p.Msg.Topic, Partition: p.Msg.Partition, Offset: p.Msg.Offset}
	if p.Msg.Headers, err = kafkapark.HeadersFromJSON(headers); err != nil {
		return Parked{}, errfmt.Errorf("parked %s: headers: %w", p.ID, err)
	}
	return p, nil
}
