package inbox

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkapark"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

var (
	// ErrInvalid marks bad input; the error's text names the argument.
	ErrInvalid = errors.New("inbox: invalid argument")
	// ErrNoID means the identity could not be read from a message (e.g. the
	// header is missing). Run parks such a message, never skips it, and
	// stops with an error wrapping ErrNoID when ten of one partition's
	// messages in a row lack one (see Run).
	ErrNoID = errors.New("inbox: message has no identity")
	// ErrAmbiguousCommit means the transaction's COMMIT was sent and the
	// connection then failed: the effect may or may not be recorded. The
	// message is still uncommitted in Kafka, so it will be redelivered and
	// the inbox will tell.
	ErrAmbiguousCommit = errors.New("inbox: commit outcome unknown")
)

func invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// checkCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return nil
}

// Handler applies one message's effect inside tx. It must do all its work
// through tx: that is what makes the effect and the inbox record commit
// together. It may run more than once for a message whose earlier attempt
// failed (and rolled back), never after one that committed.
//
// tx is the pgx.Tx that the DB's Begin returned, as is: a Handler may
// type-assert its own Tx type (a DB of yours that wraps transactions for
// metrics or tracing). One exception keeps a Handler's statements working
// behind PgBouncer before 1.21: once nolock has learnt that the
// connection's endpoint does not keep named prepared statements (pgx's
// default cache_statement mode there, see docs/deploying.md), tx is
// nolock's wrapper of that transaction, which sends the Handler's
// statements unnamed. With any other query exec mode tx is always the
// DB's own. Return a statement's error wrapped (%w), so nolock can learn
// from it.
type Handler func(ctx context.Context, tx pgx.Tx, msg kafka.Message) error

// DB is what an Inbox needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx
// satisfies it. It may grow in later versions. New accepts those three;
// what each gives:
//
//   - A pool: each batch is a transaction of its own, on a connection of
//     its own; Run works on its partitions concurrently, and Process may
//     be called concurrently. A commit whose caller stopped waiting runs
//     on, and Close waits for it.
//   - A *pgx.Conn: the same, one transaction at a time: Run processes one
//     batch at a time over all partitions, and Process, ListParked and
//     the other calls must not run concurrently with each other or with
//     Run (the connection runs one statement at a time). A call waits for
//     its commit to end, whatever its ctx does (at most
//     pgoutcome.CommitTimeout), so that nothing runs on the connection
//     once it returned.
//   - A pgx.Tx, your transaction: each batch is a savepoint of it and
//     commits nothing: the handler's effects and the inbox's records are
//     applied in your transaction, durable only once you commit it, and a
//     rollback of yours takes them back, so the messages count as new
//     again. Process and the other calls must not run concurrently; Run
//     refuses (ErrInvalid), since the Kafka offsets it commits would be
//     durable before your transaction is.
//     The batch timeout does not bind your transaction (only the
//     handler's ctx bounds a batch).
//
// A wrapper of yours that New cannot see through (for metrics or tracing)
// is taken as is, as a pool: it must then be safe for concurrent use and
// begin transactions that commit on their own.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Inbox records processed messages in PostgreSQL in the same transaction as
// their effect, so Kafka's at-least-once delivery has effectively-once
// effects. An Inbox is safe for concurrent use. A commit whose caller
// stopped waiting (its ctx ended) runs on to its end on a goroutine of the
// Inbox, at most pgoutcome.CommitTimeout; Close waits for those.
type Inbox struct {
	settings
	db          DB
	pg          *pgerr.Committer // its writes; Close waits for their commits
	over        pgmode.Override  // for statements on db outside a transaction
	consumer    string
	idleTimeout any // batchTimeout in ms, for set_config; nil: leave it (see New)

	schema                                                    string
	claimSQL, wmLockSQL, wmInitSQL, wmSetSQL, idleSQL         string
	attemptSQL, clearSQL, reapSQL, reapAttemptsSQL, recordSQL string
	parked                                                    kafkapark.Store
	counts                                                    counters
	running                                                   running // what Run learnt from its Readers
}

// note reports e, named name (one of the Event constants), about msg's
// partition ("topic/partition"), or about msg itself
// ("topic/partition@offset") if one is true.
func (in *Inbox) note(ctx context.Context, name string, msg kafka.Message, one bool, e observe.Event) {
	if in.obs == nil {
		return
	}
	offset := int64(-1)
	if one {
		offset = msg.Offset
	}
	e.Name, e.Key = name, kafkapark.EventKey(msg.Topic, msg.Partition, offset)
	if q, ok := ctx.Value(queueKey{}).(*notify.Queue); ok {
		q.Notify(ctx, e) // Run's (see Run)
		return
	}
	observed.Event(in.obs, ctx, e)
}

// queueKey carries Run's event queue in the contexts of its batches.
type queueKey struct{}

// idle sets the transaction's idle_in_transaction_session_timeout to the
// batch timeout from within the transaction's first statement: one
// statement, one round trip. set_config is volatile, so the CTE is not
// inlined away; the statement's rows come from joining it. A NULL timeout
// keeps the current one.
const idle = `WITH idle AS (SELECT ` + setIdle + `)
`

// setIdle sets idle_in_transaction_session_timeout to parameter $%d, or
// leaves it if that is NULL.
const setIdle = `set_config('idle_in_transaction_session_timeout',
  coalesce($%d::text, current_setting('idle_in_transaction_session_timeout')), true)`

// longestSuffix is the longest suffix New appends to the table name.
const longestSuffix = "_processed_at"

//go:embed inbox.sql
var schemaSQL string

// New returns an Inbox on db, a *pgxpool.Pool (the usual), a *pgx.Conn or
// a pgx.Tx (see DB for what each gives), for the consumer named consumer
// (usually the Kafka group ID: each consumer processes a message once). Run its CreateSchema,
// or put its Schema in your migrations, first.
//
// An identity is recorded per consumer name, not per topic: ids must be
// unique across every topic one consumer name reads. A consumer name
// reused for a second topic whose ids repeat the first's skips those
// messages as duplicates (Stats.Duplicates, logged at Info once per
// batch); give each topic's consumer a name of its own, or an identity
// that includes the topic (ByFunc).
func New(db DB, consumer string, opts ...Option) (*Inbox, error) {
	in := &Inbox{db: db, consumer: consumer, settings: defaults()}
	if err := option.Apply(opts, func(o Option) { o(&in.settings) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	prefix := in.table
	switch {
	case pgarg.NilDB(db):
		return nil, invalid("db is nil")
	case consumer == "":
		return nil, invalid("consumer is empty")
	case strings.IndexByte(consumer, 0) >= 0 || !utf8.ValidString(consumer):
		return nil, invalid("consumer %q is not UTF-8 without NUL", consumer)
	}
	if err := in.validate(); err != nil {
		return nil, err
	}
	if err := pgarg.Ident("table prefix", prefix, len(longestSuffix)); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	in.pg = new(pgerr.Committer)
	if pgarg.Single(db) != "" {
		in.pg = pgerr.Inline() // each call waits for its commit: the handle is free when it returns
	}
	in.over = in.pg.For(db)
	if in.log == nil {
		in.log = slog.New(slog.DiscardHandler)
	}
	q := func(suffix string) string { return pgx.Identifier{prefix + suffix}.Sanitize() }
	t, wm, att := q(""), q("_watermarks"), q("_attempts")
	in.parked = kafkapark.NewStore(prefix + "_parked")
	in.schema = strings.NewReplacer("{{inbox}}", t, "{{inbox_processed_at}}", q("_processed_at"),
		"{{watermarks}}", wm, "{{attempts}}", att).Replace(schemaSQL) + in.parked.Schema()
	// One statement claims a batch: the ids inserted are the new messages;
	// an id already there (or repeated in the batch) is a duplicate. A
	// concurrent claim of the same id waits on the unique index until the
	// other transaction ends, then sees its row or inserts its own. Ids go
	// in sorted order, so two batches sharing ids cannot deadlock.
	in.claimSQL = fmt.Sprintf(idle, 3) + `INSERT INTO ` + t + ` (consumer, id) SELECT $1, id FROM unnest($2::text[]) AS u(id), idle ORDER BY id
ON CONFLICT DO NOTHING RETURNING id`
	in.wmInitSQL = fmt.Sprintf(idle, 4) + `INSERT INTO ` + wm + ` (consumer, topic, partition, next) SELECT $1, $2, $3, 0 FROM idle ON CONFLICT DO NOTHING`
	in.idleSQL = `SELECT ` + fmt.Sprintf(setIdle, 1)
	in.idleTimeout = strconv.FormatInt(in.batchTimeout.Milliseconds(), 10)
	if _, ok := db.(pgx.Tx); ok {
		// Its savepoints' SET LOCAL would outlive them, binding the
		// caller's transaction: the handler's ctx alone bounds a batch.
		in.idleTimeout = nil
	}
	in.wmLockSQL = `SELECT next FROM ` + wm + ` WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE`
	in.wmSetSQL = `UPDATE ` + wm + ` SET next = $4 WHERE consumer = $1 AND topic = $2 AND partition = $3`
	in.attemptSQL = `INSERT INTO ` + att + ` AS a (consumer, id, attempts, last_error) VALUES ($1, $2, 1, $3)
ON CONFLICT (consumer, id) DO UPDATE SET attempts = a.attempts + 1, last_error = $3, updated_at = now() RETURNING attempts`
	in.clearSQL = `DELETE FROM ` + att + ` WHERE consumer = $1 AND id = $2`
	// Each reap statement deletes at most $2 rows, locked first and
	// skipped if another transaction holds them. The ids table's go by
	// key, found in the primary key, not by ctid: partitioned (nolock
	// schema -partitioned), a ctid names a row only within its partition.
	in.reapSQL = `DELETE FROM ` + t + ` WHERE consumer = $3 AND processed_at < now() - $1::interval AND id = ANY (ARRAY(
SELECT id FROM ` + t + ` WHERE processed_at < now() - $1::interval AND consumer = $3 LIMIT $2 FOR UPDATE SKIP LOCKED))`
	in.reapAttemptsSQL = `DELETE FROM ` + att + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + att + `
WHERE updated_at < now() - $1::interval AND consumer = $3 LIMIT $2 FOR UPDATE SKIP LOCKED))`
	in.recordSQL = `INSERT INTO ` + t + ` (consumer, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`
	return in, nil
}

// Schema returns the DDL of the Inbox's tables, for migration tools.
func (in *Inbox) Schema() string { return in.schema }

// CreateSchema creates the tables if they do not exist. It is safe to call
// from many processes at once: the DDL runs in one transaction that first
// takes a transaction-scoped advisory lock (pg_advisory_xact_lock, the same
// key for all of nolock's schemas).
func (in *Inbox) CreateSchema(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := pgschema.Create(ctx, in.db, in.schema); err != nil {
		return errfmt.Errorf("inbox: create schema: %w", err)
	}
	return nil
}

// Close waits for the commits in flight whose callers stopped waiting
// (each bounded by pgoutcome.CommitTimeout). It is idempotent and safe to
// call concurrently; call it after Run has returned. A call after Close
// still works, its caller waiting for its commit whatever ctx does; the
// database handle is the caller's to close.
func (in *Inbox) Close() error {
	in.pg.Close()
	return nil
}
