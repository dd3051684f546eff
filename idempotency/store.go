package idempotency

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

// DB is what a Store needs from pgx: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx satisfies it. It may grow in later versions. New accepts those
// three (and any type with the pool's Acquire method); what each gives:
//
//   - A pool: each call of Do or Exec holds one connection for its
//     transaction, which it begins in the claim's round trip and commits
//     in the record's. Calls run concurrently; a commit whose caller
//     stopped waiting runs on, and Close waits for it.
//   - A *pgx.Conn: the same, one call at a time (a *pgx.Conn is not safe
//     for concurrent use: the Store's calls queue for it, and you must
//     not use it yourself while one runs). A call waits for its commit to
//     end, whatever its ctx does (at most pgoutcome.CommitTimeout), so
//     that nothing runs on the connection once the call has returned.
//   - A pgx.Tx, your transaction: Do and Exec run in a savepoint of it
//     and commit nothing: the effect and the record commit when you
//     commit it, so both are yours to make durable, and a failed COMMIT
//     of yours is your ambiguity to settle (call Do again with the same
//     key in a new transaction). The key's lock and row (after a replay,
//     the lock with a synchronous standby) stay held until then, so a
//     duplicate elsewhere waits for your transaction. A deadlock or
//     serialization failure is returned rather than retried (roll your
//     transaction back and run it again), and a replay on a server with a
//     synchronous standby is safe to acknowledge only once your COMMIT
//     has returned. The Store's calls queue for the transaction, which is
//     not safe for concurrent use either. Run it Read Committed: under
//     Repeatable Read or Serializable, a duplicate that waited for
//     another transaction's key fails with a serialization failure.
//
// Get, Reap and CreateSchema run on each of them (on a pgx.Tx, inside
// it); Middleware needs a Store on a pool (see Middleware).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Func makes the effect of a request through tx, and only through tx, and
// returns the result to store for the key, in the caller's encoding (nil
// is stored as nil). An error rolls back everything, fn's writes and the
// key's claim, unless it is marked with Terminal. fn must not commit or
// roll back tx (tx.Commit and tx.Rollback refuse), must not use tx after
// it returns or from another goroutine, and may run more than once for one
// call of Do (after a deadlock or serialization failure, which roll back
// everything first), so it must do nothing outside tx. Nested transactions
// (tx.Begin) are savepoints.
type Func func(ctx context.Context, tx pgx.Tx) (result []byte, err error)

// Store records idempotency keys in a PostgreSQL table, in the same
// transaction as the effect they guard: the key is claimed, the caller's
// function runs, and the result is stored, all in one transaction, so a
// key is never recorded without its effect, nor an effect committed
// without its key.
//
// A Store is safe for concurrent use. A commit whose caller stopped
// waiting (its ctx ended) runs on to its end on a goroutine of the Store,
// at most pgoutcome.CommitTimeout; Close waits for those.
type Store struct {
	db   DB
	via  via           // how db is reached (see DB)
	turn chan struct{} // one call at a time on a *pgx.Conn or pgx.Tx
	busy atomic.Int64  // waits for a key held (tests)
	// keys holds each (scope, key) of a call in flight, closed when the
	// call ends (see queueKey).
	keysMu sync.Mutex
	keys   map[string]chan struct{}
	// poll spaces the attempts of a call that waits for a request in
	// flight with its key: full jitter from 2 ms, doubling, capped at 50
	// ms, so a duplicate learns the first's outcome within about 50 ms.
	poll      backoff.Policy
	obs       observe.Observer
	log       *slog.Logger     // never nil
	pg        *pgerr.Committer // its writes; Close waits for their commits
	over      pgmode.Override  // for statements on db outside a transaction
	retention time.Duration
	wait      time.Duration
	policy    backoff.Policy

	schemaSQL, claimSQL, claimBoundSQL, readSQL, takeoverSQL, recordSQL, reapSQL, probeSQL string

	// claimedSQL and claimedTakeoverSQL are formats: Exec puts the
	// caller's statement and its parameters' numbers in.
	claimedSQL, claimedTakeoverSQL string
	// statements keeps each statement given to Exec, wrapped (see
	// statement).
	statements     sync.Map      // string → wrapped
	describing     chan struct{} // a semaphore: one describe at a time
	describedTexts int           // guarded by describing
	maxDescribed   int           // maxDescribed; tests lower it
	execPlan       plan          // Exec's
	doPlan         plan          // Do's
}

// Defaults for New.
const (
	DefaultTable     = "nolock_idempotency"
	DefaultRetention = idemrecord.DefaultRetention // 24 h
	DefaultWait      = idemrecord.DefaultWait      // 5 s
	// DefaultAttempts bounds the runs of a transaction that fails with a
	// deadlock or a serialization failure, unless WithAttempts says
	// otherwise; cas retries conflicts as often by default.
	DefaultAttempts = backoff.DefaultAttempts // 10
	// MaxWait bounds WithWait: PostgreSQL's lock_timeout takes at most
	// 2^31-1 ms (about 24.8 days).
	MaxWait = idemrecord.MaxWait
	// MaxRetention bounds WithRetention: 100 years.
	MaxRetention = idemrecord.MaxRetention
	// MaxReapBatch bounds Reap's batch size.
	MaxReapBatch = 100_000
)

// expiresSuffix names the expiry index after the table; New keeps that
// name within PostgreSQL's identifier length (pgarg.Ident).
const expiresSuffix = "_expires_at"

// Option configures New: WithTable, WithRetention, WithWait, WithAttempts,
// WithObserver, WithLogger. Package dynamoidempotency has its own, so an
// option of one store given to the other is a compile error.
type Option func(*config)

type config struct {
	table     string
	retention time.Duration
	wait      time.Duration
	attempts  int
	obs       observe.Observer
	log       *slog.Logger
}

// WithObserver reports each Do and Exec call's outcome (EventRan,
// EventReplayed, EventMismatch, EventInProgress or EventFailed, after
// EventExpired if the call took an expired record's key over) and each
// Reap that deleted rows (EventReaped) to o (nil: none); the constants'
// docs say their fields. Do and Exec are calls (CallDo, CallExec): fn gets
// Start's context; End, on the calling goroutine, follows the transaction.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.obs = observe.Guard(o) }
}

// WithLogger logs to l (nil, the default, discards), after each Do or
// Exec call's transaction has ended: a replay ("idempotency: replayed")
// and a key reused with another request at Debug, a concurrent duplicate
// that kept the key past the wait ("idempotency: duplicate still in
// progress") at Info, a transaction retried after a deadlock or
// serialization failure ("idempotency: conflict; retrying": attempt,
// delay, err) at Debug, the attempts running out ("idempotency: gave up":
// attempts, err) and an ambiguous commit ("idempotency: commit outcome
// unknown") at Warn, each with key; and Reap's count ("idempotency:
// reaped": deleted) at Debug. l runs on the calling goroutine.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// observe reports a Do or Exec call's outcome (see WithObserver and
// WithLogger).
func (s *Store) observe(ctx context.Context, c *idemrecord.Call, key string, res Result, err error) {
	idemrecord.LogOutcome(ctx, s.log, key, s.policy.Attempts, res.Replayed, err)
	c.Observe(res.Replayed, err)
}

// WithTable sets the table's name (default "nolock_idempotency"), at most
// 52 bytes of UTF-8 without NUL (New refuses others). The name is quoted, never
// interpolated raw. Several Stores may share a table.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithRetention sets how long a record counts after its key is claimed
// (default 24 h): after that the key is treated as unused, and Reap may
// delete the record. Each record keeps the expiry it was written with, so
// Stores with different retentions may share a table. At most
// MaxRetention.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithWait bounds how long Do and Exec wait for a concurrent request with
// the same key to finish (default 5 s; they hold no connection while they
// wait), and Exec each lock wait of its statement (lock_timeout), before
// returning ErrInProgress. 0 means until the context ends. A context
// deadline shortens it (less a margin), so that the wait, or the
// database, gives up first and the connection survives.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithAttempts bounds how many times Do and Exec run the transaction when it fails
// with a deadlock or a serialization failure (default DefaultAttempts,
// 10; 1 means never retry; at most 100). Each retry starts from a full
// rollback.
func WithAttempts(n int) Option { return func(c *config) { c.attempts = n } }

func newConfig(opts []Option) (config, error) {
	cfg := config{table: DefaultTable, retention: DefaultRetention, wait: DefaultWait, attempts: DefaultAttempts}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return cfg, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if cfg.table == "" {
		return cfg, idemrecord.Invalid("table is empty")
	}
	if err := idemrecord.ValidTiming(cfg.retention, cfg.wait); err != nil {
		return cfg, err
	}
	if cfg.attempts < 1 || cfg.attempts > 100 {
		return cfg, idemrecord.Invalid("WithAttempts(%d): outside [1, 100]", cfg.attempts)
	}
	return cfg, nil
}

// New returns a Store on db: a *pgxpool.Pool (the usual), a *pgx.Conn or
// a pgx.Tx (see DB for what each gives). Run CreateSchema (or put Schema
// in your migrations) first.
func New(db DB, opts ...Option) (*Store, error) {
	if pgarg.NilDB(db) {
		return nil, idemrecord.Invalid("db is nil")
	}
	via, err := viaOf(db)
	if err != nil {
		return nil, err
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if via == viaTx {
		cfg.attempts = 1 // the transaction is the caller's to run again
	}
	// The server would cut longer names (and the index's) short, and Exec
	// would not recognise its own table in errors.
	if err := pgarg.Ident("table", cfg.table, len(expiresSuffix)); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	table := pgx.Identifier{cfg.table}.Sanitize()
	literal := "E'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(table) + "'"
	sql := strings.NewReplacer("{{table}}", table, "{{table_literal}}", literal,
		"{{expires_index}}", pgx.Identifier{cfg.table + expiresSuffix}.Sanitize()).Replace
	format := strings.NewReplacer("{{table}}", strings.ReplaceAll(table, "%", "%%"), // for fmt.Sprintf
		"{{table_literal}}", strings.ReplaceAll(literal, "%", "%%")).Replace
	pg := new(pgerr.Committer)
	return &Store{
		db: db, via: via, turn: make(chan struct{}, 1), keys: make(map[string]chan struct{}), pg: pg, over: pg.For(db), claimedSQL: format(claimedSQL), claimedTakeoverSQL: format(claimedTakeoverSQL),
		retention: cfg.retention, wait: cfg.wait, policy: backoff.Policy{Attempts: cfg.attempts}, poll: backoff.Policy{Base: 2 * time.Millisecond, Cap: 50 * time.Millisecond}, obs: cfg.obs, log: idemrecord.Logger(cfg.log),
		schemaSQL: sql(storeSQL), claimSQL: sql(claimSQL), claimBoundSQL: sql(claimBoundSQL), readSQL: sql(readSQL), describing: make(chan struct{}, 1), maxDescribed: maxDescribed,
		takeoverSQL: sql(takeoverSQL), probeSQL: sql(probeSQL), recordSQL: sql(recordSQL), reapSQL: sql(reapSQL),
	}, nil
}

// Close waits for the commits in flight whose callers stopped waiting
// (each bounded by pgoutcome.CommitTimeout), and the connections they
// hold to be released. It is idempotent and safe to call concurrently. A
// call after Close still works, its caller waiting for its commit
// whatever ctx does; the database handle is the caller's to close.
func (s *Store) Close() error {
	s.pg.Close()
	return nil
}

// Schema returns the DDL of the Store's table, for migration tools.
func (s *Store) Schema() string { return s.schemaSQL }

// CreateSchema creates the Store's table and index if they do not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (s *Store) CreateSchema(ctx context.Context) error {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return err
	}
	if err := s.onDB(ctx, func(ctx context.Context) error { return pgschema.Create(ctx, s.db, s.schemaSQL) }); err != nil {
		return errfmt.Errorf("idempotency: create schema: %w", err)
	}
	return nil
}

// waitFor returns a call's wait for its key, and Exec's lock_timeout: the
// Store's wait, shortened to what is left before ctx's deadline less a
// margin (a fifth of it, at least 50 ms), so that the server gives up, and
// its answer (ErrInProgress) reaches the caller, before the deadline ends
// the call. 0: no bound.
func (s *Store) waitFor(ctx context.Context) time.Duration {
	w := s.wait
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left -= max(left/5, 50*time.Millisecond); w == 0 || left < w {
			w = max(left, time.Millisecond)
		}
	}
	return min(w, MaxWait) // lock_timeout's limit
}

// bound returns waitFor(ctx) and the lock_timeout parameter of Exec's
// claim (claimBoundSQL) for it: milliseconds as text, or nil (no bound)
// to keep the connection's.
func (s *Store) bound(ctx context.Context) (time.Duration, any) {
	wait := s.waitFor(ctx)
	if wait <= 0 {
		return 0, nil
	}
	return wait, strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
}

// Get returns the live record of (scope, key), or ErrNotFound. It is a
// snapshot: useful after ErrAmbiguousCommit, or to show a key's outcome.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return Record{}, err
	}
	if err := idemrecord.ValidRequest(scope, key, nil, false); err != nil {
		return Record{}, err
	}
	return s.get(ctx, scope, key)
}

// get is Get without the argument checks.
func (s *Store) get(ctx context.Context, scope, key string) (Record, error) {
	f, err := s.lookup(ctx, scope, key)
	if err == nil && f.expired {
		return Record{}, ErrNotFound
	}
	return f.Record, err
}

// lookup returns the record of (scope, key), live or expired; ErrNotFound
// if there is none.
func (s *Store) lookup(ctx context.Context, scope, key string) (found, error) {
	f := found{Record: Record{Scope: scope, Key: key}, exists: true}
	err := s.onDB(ctx, func(ctx context.Context) error {
		return f.scan(s.over.QueryRow(ctx, s.db, s.readSQL, scope, key))
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return found{}, ErrNotFound
	case err != nil:
		return found{}, errfmt.Errorf("idempotency: get %q: %w", key, pgmode.Explain(err))
	}
	return f, nil
}

// Reap deletes expired records, at most batch per statement (each its own
// short transaction), until none is left, and returns how many it deleted.
// Records being replaced by a concurrent Do are skipped, not waited for.
// Cancelling ctx stops it between batches; what was deleted stays deleted.
// Run it periodically (for example every few minutes); Do never needs it
// for correctness, since an expired record already counts as absent.
func (s *Store) Reap(ctx context.Context, batch int) (int64, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return 0, err
	}
	if batch <= 0 || batch > MaxReapBatch {
		return 0, idemrecord.Invalid("batch %d outside [1, %d]", batch, MaxReapBatch)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var tag pgconn.CommandTag
		err := s.onDB(ctx, func(ctx context.Context) error {
			var err error
			tag, err = s.over.Exec(ctx, s.db, s.reapSQL, batch)
			return err
		})
		if err != nil {
			return total, errfmt.Errorf("idempotency: reap: %w", pgmode.Explain(err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			s.log.LogAttrs(ctx, slog.LevelDebug, "idempotency: reaped", slog.Int64("deleted", total))
			if total > 0 && s.obs != nil { // guarded: a panic of o is recovered
				s.obs.Event(ctx, observe.Event{Name: EventReaped, N: total})
			}
			return total, nil
		}
	}
}
