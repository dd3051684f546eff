package inbox

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

// ErrNotParked means no parked message of this Inbox's consumer has the
// given id: it never was parked, or it was replayed or purged since.
var ErrNotParked = errors.New("inbox: no such parked message")

// Parked is a parked message as stored in the parked table.
type Parked struct {
	// ID is the message's identity: what ReplayParked and PurgeParked
	// take. A message without one, and every message under ByWatermark,
	// is known by ByOffset's "topic/partition/offset".
	ID string
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

// parkedStatements is the SQL of the operator's calls on parked messages.
type parkedStatements struct {
	list, take, record, failed, purge, purgeOlder string
}

func newParkedStatements(inbox, parked string) parkedStatements {
	const cols = `topic, partition, "offset", key, value, headers, error, attempts, parked_at`
	return parkedStatements{
		list: `SELECT id, ` + cols + ` FROM ` + parked + `
WHERE consumer = $1 AND id > $2 ORDER BY id LIMIT $3`,
		// take deletes the row, so it holds the row's lock until the
		// replay ends: a concurrent replay or purge of the same id waits,
		// then finds the row gone (or, after a rollback, still there).
		take:       `DELETE FROM ` + parked + ` WHERE consumer = $1 AND id = $2 RETURNING id, ` + cols,
		record:     `INSERT INTO ` + inbox + ` (consumer, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
		failed:     `UPDATE ` + parked + ` SET error = $3, attempts = attempts + 1 WHERE consumer = $1 AND id = $2`,
		purge:      `DELETE FROM ` + parked + ` WHERE consumer = $1 AND id = $2`,
		purgeOlder: `DELETE FROM ` + parked + ` WHERE consumer = $1 AND parked_at < now() - $2::interval`,
	}
}

// ListParked returns up to limit of this Inbox's consumer's parked
// messages whose id sorts after after ("" for the first page), in id
// order: pass the last one's ID to get the next page. It reads a
// snapshot; it locks nothing.
func (in *Inbox) ListParked(ctx context.Context, after string, limit int) ([]Parked, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, err
	}
	if limit < 1 {
		return nil, invalid("limit %d is below 1", limit)
	}
	if err := checkParkedID("after", after, true); err != nil {
		return nil, err
	}
	tx, err := in.pg.Begin(ctx, in.db)
	if err != nil {
		return nil, errfmt.Errorf("inbox: list parked: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, in.parked.list, in.consumer, after, limit)
	if err != nil {
		return nil, errfmt.Errorf("inbox: list parked: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, errfmt.Errorf("inbox: list parked: %w", err)
	}
	return out, nil
}

// ReplayParked runs h on the parked message id, in one transaction that
// takes the message off the parked table and records it as processed
// (again, should Reap have dropped the record), with h's effect: they
// commit together or not at all. So a parked message is applied at most
// once by replays, however many run at once: a concurrent replay of the
// same id waits for this one's transaction and then, if it committed,
// returns ErrNotParked.
//
// If h fails (or panics), nothing of the replay commits, the message stays
// parked with its Error set to h's and its Attempts counted, and the error
// returned is a *HandlerError wrapping h's. A commit whose outcome is
// unknown returns ErrAmbiguousCommit: replay again, which either applies
// it or reports ErrNotParked. An unknown id is ErrNotParked; an empty id,
// a nil h or a nil ctx is ErrInvalid, before any I/O. A replayed message
// is applied out of its partition's order, after the messages that
// followed it.
func (in *Inbox) ReplayParked(ctx context.Context, id string, h Handler) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if h == nil {
		return invalid("handler is nil")
	}
	if err := checkParkedID("id", id, false); err != nil {
		return err
	}
	run := recovering(h)
	err := in.inTx(ctx, func(tx *pgerr.Tx) error {
		rows, err := tx.Query(ctx, in.parked.take, in.consumer, id)
		if err != nil {
			return errfmt.Errorf("inbox: replay %q: %w", id, err)
		}
		p, err := pgx.CollectExactlyOneRow(rows, scanParked)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return errfmt.Errorf("inbox: replay %q: %w", id, ErrNotParked)
		case err != nil:
			return errfmt.Errorf("inbox: replay %q: %w", id, err)
		}
		if !in.identity.watermark {
			if _, err := tx.Exec(ctx, in.parked.record, in.consumer, id); err != nil {
				return errfmt.Errorf("inbox: replay %q: record: %w", id, err)
			}
		}
		if err := run(ctx, tx.Handed(), p.Msg); err != nil {
			tx.Learn(err)
			return &HandlerError{Msg: p.Msg, Err: err}
		}
		return nil
	})
	var he *HandlerError
	if !errors.As(err, &he) {
		return err
	}
	// The replay rolled back: the message is still parked. Say why there.
	if _, uerr := in.db.Exec(ctx, in.parked.failed, in.over.Args(in.consumer, id, kafkapark.Text(he.Err.Error()))...); uerr != nil {
		return errfmt.Errorf("%w (recording the failure: %w)", he, uerr)
	}
	return he
}

// PurgeParked deletes the parked message id without applying it. It
// returns ErrNotParked if there is none (purged or replayed meanwhile). A
// purge waits for a replay of the same id in flight, so a message is
// never both replayed and purged.
func (in *Inbox) PurgeParked(ctx context.Context, id string) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := checkParkedID("id", id, false); err != nil {
		return err
	}
	tag, err := in.db.Exec(ctx, in.parked.purge, in.over.Args(in.consumer, id)...)
	if err != nil {
		return errfmt.Errorf("inbox: purge parked %q: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errfmt.Errorf("inbox: purge parked %q: %w", id, ErrNotParked)
	}
	return nil
}

// PurgeParkedOlderThan deletes this Inbox's consumer's messages parked
// longer ago than retention (by the database's clock), without applying
// them, and returns how many it deleted. It is the parked table's
// retention: nothing purges parked messages by itself, so schedule it
// (e.g. daily, beside Reap) with the time operators have to act.
func (in *Inbox) PurgeParkedOlderThan(ctx context.Context, retention time.Duration) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	if retention <= 0 {
		return 0, invalid("retention %v is not positive", retention)
	}
	iv := fmt.Sprintf("%d microseconds", retention.Microseconds())
	tag, err := in.db.Exec(ctx, in.parked.purgeOlder, in.over.Args(in.consumer, iv)...)
	if err != nil {
		return 0, errfmt.Errorf("inbox: purge parked: %w", err)
	}
	return tag.RowsAffected(), nil
}

// checkParkedID refuses an id that no parked row can have: empty (unless
// empty is allowed), or not text PostgreSQL stores.
func checkParkedID(name, id string, empty bool) error {
	switch {
	case id == "" && !empty:
		return invalid("%s is empty", name)
	case !utf8.ValidString(id) || strings.IndexByte(id, 0) >= 0:
		return invalid("%s %q is not UTF-8 without NUL", name, id)
	}
	return nil
}

// scanParked reads one parked row: id, then the parked columns.
func scanParked(row pgx.CollectableRow) (Parked, error) {
	var p Parked
	var headers []byte
	err := row.Scan(&p.ID, &p.Msg.Topic, &p.Msg.Partition, &p.Msg.Offset, &p.Msg.Key, &p.Msg.Value,
		&headers, &p.Error, &p.Attempts, &p.ParkedAt)
	if err != nil {
		return Parked{}, err
	}
	if p.Msg.Headers, err = kafkapark.HeadersFromJSON(headers); err != nil {
		return Parked{}, errfmt.Errorf("parked %q: headers: %w", p.ID, err)
	}
	return p, nil
}
