package kafkapark

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgmode"
)

//go:embed parked.sql
var parkedSQL string

// Row is a parked row: the message as stored and why it was parked.
type Row struct {
	ID        ID
	Msg       kafka.Message // Topic, Partition, Offset, Key, Value, Headers
	Error     string        // the last failed attempt's, replays included
	Attempts  int           // failed attempts, replays included
	Epoch     int64         // partition's claim; 0 in inbox
	MessageID string        // inbox's identity of the message; "" in partition
	ParkedAt  time.Time     // by the database's clock
}

// Store is the SQL of one parked table, quoted once. Every call runs on a
// transaction the caller began, so the caller chooses its bounds (a batch
// timeout, a lock taken first) and commits.
type Store struct {
	schema, insert, exists, list, take, failed, purge, purgeOlder string
}

// NewStore returns the statements of the parked table named table
// (unquoted).
func NewStore(table string) Store {
	t := pgx.Identifier{table}.Sanitize()
	const key = `group_id = $1 AND topic = $2 AND partition_id = $3 AND "offset" = $4`
	const cols = `topic, partition_id, "offset", key, value, headers, error, attempts, epoch, coalesce(message_id, ''), parked_at`
	return Store{
		schema: strings.NewReplacer("{{parked}}", t, "{{parked_at}}", pgx.Identifier{indexName(table)}.Sanitize()).Replace(parkedSQL),
		insert: `INSERT INTO ` + t + ` (group_id, topic, partition_id, "offset", key, value, headers, error, attempts, epoch, message_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULLIF($11, '')) ON CONFLICT DO NOTHING`,
		exists: `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE ` + key + `)`,
		list: `SELECT ` + cols + ` FROM ` + t + `
WHERE group_id = $1 AND (topic, partition_id, "offset") > ($2, $3, $4)
ORDER BY topic, partition_id, "offset" LIMIT $5`,
		// take deletes the row, so it holds the row's lock until the
		// replay ends: a concurrent replay or purge of the same id waits,
		// then finds the row gone (or, after a rollback, still there).
		take:   `DELETE FROM ` + t + ` WHERE ` + key + ` RETURNING ` + cols,
		failed: `UPDATE ` + t + ` SET error = $5, attempts = attempts + 1 WHERE ` + key,
		purge:  `DELETE FROM ` + t + ` WHERE ` + key,
		// purgeOlder deletes at most $3 rows, locked first and skipped if
		// a replay or another purge holds them, found by the index on
		// (group_id, parked_at).
		purgeOlder: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + t + `
WHERE group_id = $1 AND parked_at < now() - $2::interval LIMIT $3 FOR UPDATE SKIP LOCKED))`,
	}
}

// indexName is the name of table's index on (group_id, parked_at):
// table + "_at", shortened with a hash of the whole name to fit
// PostgreSQL's 63 bytes, which would otherwise cut it (and could make two
// tables' index names one).
func indexName(table string) string {
	const max, suffix = 63, "_at"
	if len(table)+len(suffix) <= max {
		return table + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	tail := fmt.Sprintf("_%08x%s", h.Sum32(), suffix)
	cut := max - len(tail)
	for cut > 0 && !utf8.RuneStart(table[cut]) {
		cut--
	}
	return table[:cut] + tail
}

// Schema is the parked table's DDL (idempotent).
func (s Store) Schema() string { return s.schema }

// Park stores m, parked after attempts failed attempts with cause, unless
// a row for its position is there already.
func (s Store) Park(ctx context.Context, tx pgx.Tx, group string, m kafka.Message, cause error, attempts int, epoch int64, messageID string) error {
	_, err := tx.Exec(ctx, s.insert, group, m.Topic, m.Partition, m.Offset, m.Key, m.Value,
		HeadersJSON(m.Headers), Text(cause.Error()), attempts, epoch, messageID)
	return err
}

// Exists reports whether id is parked.
func (s Store) Exists(ctx context.Context, tx pgx.Tx, group string, id ID) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, s.exists, group, id.Topic, id.Partition, id.Offset).Scan(&ok)
	return ok, err
}

// List returns up to limit of group's rows after after (the zero ID: from
// the start), in (topic, partition, offset) order.
func (s Store) List(ctx context.Context, tx pgx.Tx, group string, after ID, limit int) ([]Row, error) {
	rows, err := tx.Query(ctx, s.list, group, after.Topic, after.Partition, after.Offset, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// ErrNotParked is Take's answer when id is not parked.
var ErrNotParked = errors.New("no such parked message")

// Take deletes id's row and returns it; its lock is held until tx ends.
func (s Store) Take(ctx context.Context, tx pgx.Tx, group string, id ID) (Row, error) {
	rows, err := tx.Query(ctx, s.take, group, id.Topic, id.Partition, id.Offset)
	if err != nil {
		return Row{}, err
	}
	r, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, ErrNotParked
	}
	return r, err
}

// Failed records a failed replay of id: its error, one more attempt.
func (s Store) Failed(ctx context.Context, tx pgx.Tx, group string, id ID, cause error) error {
	_, err := tx.Exec(ctx, s.failed, group, id.Topic, id.Partition, id.Offset, Text(cause.Error()))
	return err
}

// Purge deletes id's row; it reports whether there was one.
func (s Store) Purge(ctx context.Context, tx pgx.Tx, group string, id ID) (bool, error) {
	tag, err := tx.Exec(ctx, s.purge, group, id.Topic, id.Partition, id.Offset)
	return tag.RowsAffected() > 0, err
}

// PurgeOlder deletes at most batch of group's rows parked longer ago than
// retention, skipping rows another transaction holds, and returns how
// many it deleted.
func (s Store) PurgeOlder(ctx context.Context, tx pgx.Tx, group string, retention time.Duration, batch int) (int64, error) {
	iv := strconv.FormatInt(retention.Microseconds(), 10) + " microseconds"
	tag, err := tx.Exec(ctx, s.purgeOlder, group, iv, batch)
	return tag.RowsAffected(), err
}

// PurgeBatch is the batch of a purge by age asked for over HTTP (the
// operator's command), which names no batch.
const PurgeBatch = 1000

// Batches calls one, which deletes at most batch rows in a transaction of
// its own, until a call deletes fewer, ctx ends or a call fails, and
// returns how many rows the calls deleted: what was deleted stays
// deleted.
func Batches(ctx context.Context, batch int, one func() (int64, error)) (int64, error) {
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, err := one()
		total += n
		if err != nil || n < int64(batch) {
			return total, err
		}
	}
}

// scan reads one row of cols.
func scan(row pgx.CollectableRow) (Row, error) {
	var r Row
	var headers []byte
	err := row.Scan(&r.Msg.Topic, &r.Msg.Partition, &r.Msg.Offset, &r.Msg.Key, &r.Msg.Value,
		&headers, &r.Error, &r.Attempts, &r.Epoch, &r.MessageID, &r.ParkedAt)
	if err != nil {
		return Row{}, err
	}
	r.ID = ID{Topic: r.Msg.Topic, Partition: r.Msg.Partition, Offset: r.Msg.Offset}
	if r.Msg.Headers, err = HeadersFromJSON(headers); err != nil {
		return Row{}, errfmt.Errorf("parked %s: headers: %w", r.ID, err)
	}
	return r, nil
}

// Again runs call, a transaction of an operator's call, and runs it once
// more if it failed on a named prepared statement the server connection
// did not keep (26000, 42P05: PgBouncer before 1.21 in pgx's default
// mode). Such a failure ran nothing and rolled the transaction back, and
// the transaction's Committer learnt from it to send unnamed statements:
// without the second run, a process's first parked call through such a
// pooler (a command's only one) would fail at random.
func Again(call func() error) error {
	err := call()
	if pgmode.MissingNamed(err) {
		err = call()
	}
	return err
}
