package inbox

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
)

var (
	// ErrInvalid marks bad input; the error's text names the argument.
	ErrInvalid = errors.New("inbox: invalid argument")
	// ErrNoID means the identity could not be read from a message (e.g. the
	// header is missing). Such a message is parked, never silently skipped.
	ErrNoID = errors.New("inbox: message has no identity")
	// ErrAmbiguousCommit means the transaction's COMMIT was sent and the
	// connection then failed: the effect may or may not be recorded. The
	// message is still uncommitted in Kafka, so it will be redelivered and
	// the inbox will tell.
	ErrAmbiguousCommit = errors.New("inbox: commit outcome unknown")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// checkCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return nil
}

// permanentError marks a handler error that retrying will not fix.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks a handler's error as permanent: the message is parked at
// once instead of being retried.
func Permanent(err error) error { return permanentError{err} }

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool { return errors.As(err, new(permanentError)) }

// Handler applies one message's effect inside tx. It must do all its work
// through tx: that is what makes the effect and the inbox record commit
// together. It may run more than once for a message whose earlier attempt
// failed (and rolled back), never after one that committed.
type Handler func(ctx context.Context, tx pgx.Tx, msg kafka.Message) error

// DB is what an Inbox needs: a *pgxpool.Pool (or a *pgx.Conn, used by one
// goroutine). It may grow in later versions.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Identity says how a message is recognised when it comes again.
type Identity struct {
	name      string
	id        func(kafka.Message) (string, error)
	watermark bool
}

// ByHeader identifies a message by the value of a header set by the
// producer (e.g. "id", as Debezium's outbox does). It catches producer
// retries and duplicates, which get new offsets. The recommended identity.
func ByHeader(name string) Identity {
	return Identity{name: "header " + name, id: func(m kafka.Message) (string, error) {
		for _, h := range m.Headers {
			if h.Key == name && len(h.Value) > 0 {
				return string(h.Value), nil
			}
		}
		return "", fmt.Errorf("%w: no %q header", ErrNoID, name)
	}}
}

// ByFunc identifies a message by a function of it (e.g. a field of the
// payload). An error from id, or an empty id, means the message has no
// identity (ErrNoID): it is parked at once, known by its offset.
func ByFunc(id func(kafka.Message) (string, error)) Identity {
	return Identity{name: "func", id: id}
}

// ByOffset identifies a message by topic/partition/offset: a fallback that
// catches Kafka's redeliveries but NOT a producer's duplicate (a resent
// message gets a new offset).
func ByOffset() Identity {
	return Identity{name: "offset", id: func(m kafka.Message) (string, error) {
		return m.Topic + "/" + strconv.Itoa(m.Partition) + "/" + strconv.FormatInt(m.Offset, 10), nil
	}}
}

// ByWatermark keeps, per partition, the next offset to process, updated in
// the same transaction as the effect; a message below it is a duplicate.
// No row per message, so no cleanup; but it needs in-order processing per
// partition (kafka-go's Reader gives it) and, like ByOffset, cannot catch a
// producer's duplicate.
func ByWatermark() Identity { return Identity{name: "watermark", watermark: true} }

// Inbox records processed messages in PostgreSQL in the same transaction as
// their effect, so Kafka's at-least-once delivery has effectively-once
// effects. An Inbox is safe for concurrent use.
type Inbox struct {
	db       DB
	over     pgmode.Override // for statements on db outside a transaction
	consumer string
	identity Identity
	max      int
	hook     func(kafka.Message, error)
	log      *slog.Logger
	prefix   string

	schema                                                  string
	claimSQL, wmLockSQL, wmInitSQL, wmSetSQL                string
	attemptSQL, parkSQL, clearSQL, reapSQL, reapAttemptsSQL string
}

// Option configures New.
type Option func(*Inbox)

// WithIdentity sets how messages are recognised (default ByHeader("id")).
func WithIdentity(id Identity) Option { return func(in *Inbox) { in.identity = id } }

// WithTablePrefix names the tables: prefix, prefix_watermarks,
// prefix_attempts, prefix_parked, and the index prefix_processed_at
// (default "nolock_inbox"). Names are quoted, never interpolated raw. The
// prefix must be 1 to 50 bytes of UTF-8 without NUL, so that every name
// fits PostgreSQL's 63 bytes; New refuses any other.
func WithTablePrefix(prefix string) Option {
	return func(in *Inbox) { in.prefix = prefix }
}

// WithMaxAttempts parks a message after n failed attempts (default 5).
func WithMaxAttempts(n int) Option { return func(in *Inbox) { in.max = n } }

// WithOnPark calls f after a message is parked, with its last error. f
// must be safe for concurrent use.
func WithOnPark(f func(msg kafka.Message, err error)) Option { return func(in *Inbox) { in.hook = f } }

// WithLogger logs parked messages and retries (nil: discard).
func WithLogger(l *slog.Logger) Option { return func(in *Inbox) { in.log = l } }

// longestSuffix is the longest suffix New appends to the table prefix.
const longestSuffix = "_processed_at"

//go:embed inbox.sql
var schemaSQL string

// New returns an Inbox for the consumer named consumer (usually the Kafka
// group ID: each consumer processes a message once). Run its CreateSchema,
// or put its Schema in your migrations, first.
func New(db DB, consumer string, opts ...Option) (*Inbox, error) {
	in := &Inbox{db: db, consumer: consumer, identity: ByHeader("id"), max: 5, prefix: "nolock_inbox"}
	for _, o := range opts {
		o(in)
	}
	prefix := in.prefix
	switch {
	case pgarg.NilDB(db):
		return nil, invalid("db is nil")
	case consumer == "":
		return nil, invalid("consumer is empty")
	case strings.IndexByte(consumer, 0) >= 0 || !utf8.ValidString(consumer):
		return nil, invalid("consumer %q is not UTF-8 without NUL", consumer)
	case in.identity.id == nil && !in.identity.watermark:
		return nil, invalid("identity is empty: use ByHeader, ByFunc, ByOffset or ByWatermark")
	case in.max < 1:
		return nil, invalid("max attempts %d is below 1", in.max)
	}
	if err := pgarg.Ident("table prefix", prefix, len(longestSuffix)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	in.over = pgmode.For(db)
	if in.log == nil {
		in.log = slog.New(slog.DiscardHandler)
	}
	q := func(suffix string) string { return pgx.Identifier{prefix + suffix}.Sanitize() }
	t, wm, att, parked := q(""), q("_watermarks"), q("_attempts"), q("_parked")
	in.schema = strings.NewReplacer("{{inbox}}", t, "{{inbox_processed_at}}", q("_processed_at"),
		"{{watermarks}}", wm, "{{attempts}}", att, "{{parked}}", parked).Replace(schemaSQL)
	// One statement claims a batch: the ids inserted are the new messages;
	// an id already there (or repeated in the batch) is a duplicate. A
	// concurrent claim of the same id waits on the unique index until the
	// other transaction ends, then sees its row or inserts its own. Ids go
	// in sorted order, so two batches sharing ids cannot deadlock.
	in.claimSQL = `INSERT INTO ` + t + ` (consumer, id) SELECT $1, id FROM unnest($2::text[]) AS u(id) ORDER BY id
ON CONFLICT DO NOTHING RETURNING id`
	in.wmInitSQL = `INSERT INTO ` + wm + ` (consumer, topic, partition, next) VALUES ($1, $2, $3, 0) ON CONFLICT DO NOTHING`
	in.wmLockSQL = `SELECT next FROM ` + wm + ` WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE`
	in.wmSetSQL = `UPDATE ` + wm + ` SET next = $4 WHERE consumer = $1 AND topic = $2 AND partition = $3`
	in.attemptSQL = `INSERT INTO ` + att + ` AS a (consumer, id, attempts, last_error) VALUES ($1, $2, 1, $3)
ON CONFLICT (consumer, id) DO UPDATE SET attempts = a.attempts + 1, last_error = $3, updated_at = now() RETURNING attempts`
	in.parkSQL = `INSERT INTO ` + parked + ` (consumer, id, topic, partition, "offset", key, value, headers, error, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING`
	in.clearSQL = `DELETE FROM ` + att + ` WHERE consumer = $1 AND id = $2`
	in.reapSQL = `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(SELECT ctid FROM ` + t + `
WHERE processed_at < now() - $1::interval AND consumer = $3 LIMIT $2))`
	in.reapAttemptsSQL = `DELETE FROM ` + att + ` WHERE updated_at < now() - $1::interval AND consumer = $2`
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
		return fmt.Errorf("inbox: create schema: %w", err)
	}
	return nil
}

// Outcome says what Process did with each message.
type Outcome struct {
	Processed  int // effects applied and recorded in this call
	Duplicates int // messages recorded earlier (or twice in the batch): skipped
}

// Process records msgs and runs h for each new one, in order, all in ONE
// transaction: either every new message's effect and record commit, or
// none does. A message already recorded is skipped and counted as a
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
				return Outcome{}, fmt.Errorf("inbox: message %d (%s/%d@%d): %w", i, m.Topic, m.Partition, m.Offset, err)
			}
			ids[i] = id
		}
	}
	var out Outcome
	err := in.inTx(ctx, func(tx pgx.Tx) error {
		out = Outcome{}
		fresh, err := in.claim(ctx, tx, msgs, ids)
		if err != nil {
			return err
		}
		for i, m := range msgs {
			if !fresh[i] {
				out.Duplicates++
				continue
			}
			if err := h(ctx, tx, m); err != nil {
				if tx.Conn().IsClosed() && !ownDeadline(ctx, err) {
					// The connection died under the handler: the
					// database's trouble, not the message's.
					return &connLostError{fmt.Errorf("inbox: message %d (%s/%d@%d): connection lost: %w", i, m.Topic, m.Partition, m.Offset, err)}
				}
				return &HandlerError{Msg: m, Index: i, Err: err}
			}
			out.Processed++
		}
		return nil
	})
	if err != nil {
		return Outcome{}, err
	}
	return out, nil
}

// HandlerError is a handler's failure on one message of a batch.
type HandlerError struct {
	Msg   kafka.Message
	Index int
	Err   error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("inbox: handler failed on %s/%d@%d: %v", e.Msg.Topic, e.Msg.Partition, e.Msg.Offset, e.Err)
}

func (e *HandlerError) Unwrap() error { return e.Err }

// claim marks which of msgs are new, recording them in tx.
func (in *Inbox) claim(ctx context.Context, tx pgx.Tx, msgs []kafka.Message, ids []string) ([]bool, error) {
	fresh := make([]bool, len(msgs))
	if in.identity.watermark {
		return fresh, in.claimWatermarks(ctx, tx, msgs, fresh)
	}
	rows, err := tx.Query(ctx, in.claimSQL, in.consumer, ids)
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("inbox: claim: %w", err)
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
		if _, err := tx.Exec(ctx, in.wmInitSQL, in.consumer, k.topic, k.partition); err != nil {
			return fmt.Errorf("inbox: watermark: %w", err)
		}
		var n int64
		if err := tx.QueryRow(ctx, in.wmLockSQL, in.consumer, k.topic, k.partition).Scan(&n); err != nil {
			return fmt.Errorf("inbox: watermark: %w", err)
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
			return fmt.Errorf("inbox: watermark: %w", err)
		}
	}
	return nil
}

// inTx runs f in a transaction and commits, reporting an unknown commit
// outcome as ErrAmbiguousCommit. The commit is never cancelled by ctx (see
// pgerr.Commit).
func (in *Inbox) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	tx, err := pgerr.Begin(ctx, in.db)
	if err != nil {
		return fmt.Errorf("inbox: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if pgerr.Ambiguous(err) {
			return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
		}
		return fmt.Errorf("inbox: commit: %w", err)
	}
	return nil
}

// fail counts a failed attempt at msg outside any transaction and, when it
// is permanent or the attempts ran out, parks it: records it as processed
// (so it never runs again) and keeps it in the parked table, in one
// transaction, then calls the hook. A message found processed meanwhile
// (another member applied it, or it was parked before) is not parked
// again. It reports whether msg is done with.
func (in *Inbox) fail(ctx context.Context, msg kafka.Message, cause error) (parked bool, err error) {
	id, idErr := in.id(msg)
	if idErr != nil {
		// A message without an identity cannot be deduplicated: park it,
		// known by its offset.
		cause = errors.Join(cause, idErr)
		id, _ = ByOffset().id(msg)
	}
	var attempts int
	if err := in.db.QueryRow(ctx, in.attemptSQL, in.over.Args(in.consumer, id, text(cause.Error()))...).Scan(&attempts); err != nil {
		return false, fmt.Errorf("inbox: count attempt: %w", err)
	}
	if !IsPermanent(cause) && idErr == nil && attempts < in.max {
		in.log.Warn("inbox: handler failed; will retry", "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "attempt", attempts, "err", cause)
		return false, nil
	}
	var fresh []bool
	reason := text(cause.Error())
	err = in.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if fresh, err = in.claim(ctx, tx, []kafka.Message{msg}, []string{id}); err != nil {
			return err
		}
		if fresh[0] { // else processed meanwhile (by another member, or parked before): nothing to park
			_, err = tx.Exec(ctx, in.parkSQL, in.consumer, id, msg.Topic, msg.Partition, msg.Offset, msg.Key, msg.Value, headersJSON(msg.Headers), reason, attempts)
			if err != nil {
				return fmt.Errorf("inbox: park: %w", err)
			}
		}
		_, err = tx.Exec(ctx, in.clearSQL, in.consumer, id)
		return err
	})
	if err != nil || !fresh[0] {
		return err == nil, err
	}
	in.log.Error("inbox: message parked", "topic", msg.Topic, "partition", msg.Partition, "offset", msg.Offset, "attempts", attempts, "err", cause)
	if in.hook != nil {
		in.hook(msg, cause)
	}
	return true, nil
}

// text makes s storable as PostgreSQL text: valid UTF-8, no NUL bytes.
func text(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// headersJSON is the parked headers column: a JSON array of {"key", "value"}
// in order (repeated keys kept), a value that is not storable text given as
// "base64" instead.
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

// id is the identity of msg for the attempts and parked tables (watermark
// mode records those by offset).
func (in *Inbox) id(msg kafka.Message) (string, error) {
	if in.identity.watermark {
		return ByOffset().id(msg)
	}
	id, err := in.identity.id(msg)
	switch {
	case err != nil && !errors.Is(err, ErrNoID):
		return "", fmt.Errorf("%w: %w", ErrNoID, err)
	case err != nil:
		return "", err
	case id == "":
		return "", fmt.Errorf("%w: the %s identity is empty", ErrNoID, in.identity.name)
	case len(id) > MaxIDLen:
		return "", fmt.Errorf("%w: the %s identity is %d bytes, over %d", ErrNoID, in.identity.name, len(id), MaxIDLen)
	case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
		// PostgreSQL's text takes neither (a raw binary UUID, say).
		return "", fmt.Errorf("%w: the %s identity %q is not text without NUL bytes", ErrNoID, in.identity.name, id)
	}
	return id, nil
}

// MaxIDLen bounds a message's identity in bytes: identities live in a
// primary-key index, whose rows PostgreSQL keeps under about 2.7 kB. A
// longer one counts as no identity (ErrNoID).
const MaxIDLen = 2048

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

// Reap deletes this Inbox's consumer's records older than retention (other
// consumers sharing the tables keep theirs), at most batch rows per
// statement, until none is left, and returns how many it deleted. Keep
// retention at least as long as the longest redelivery horizon (the topic's
// retention, or how far back a consumer group can be reset): a record
// reaped earlier lets a redelivered message run again. Attempt counters
// untouched for retention go too.
func (in *Inbox) Reap(ctx context.Context, retention time.Duration, batch int) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	switch {
	case retention <= 0:
		return 0, invalid("retention %v is not positive", retention)
	case batch < 1:
		return 0, invalid("batch %d is below 1", batch)
	}
	iv := fmt.Sprintf("%d microseconds", retention.Microseconds())
	var total int64
	for {
		tag, err := in.db.Exec(ctx, in.reapSQL, in.over.Args(iv, batch, in.consumer)...)
		if err != nil {
			return total, fmt.Errorf("inbox: reap: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			break
		}
	}
	if _, err := in.db.Exec(ctx, in.reapAttemptsSQL, in.over.Args(iv, in.consumer)...); err != nil {
		return total, fmt.Errorf("inbox: reap attempts: %w", err)
	}
	return total, nil
}
