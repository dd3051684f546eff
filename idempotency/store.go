package idempotency

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
)

// DB is what a Store needs from pgx: a *pgxpool.Pool satisfies it. Do
// holds one connection for the whole transaction, so that it can begin the
// transaction in the claim's round trip and commit in the record's. It may
// grow in later versions.
type DB interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
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
// A Store is safe for concurrent use; it starts no goroutines.
type Store struct {
	db        DB
	over      pgmode.Override // for statements on db outside a transaction
	retention time.Duration
	wait      time.Duration
	policy    backoff.Policy

	table string // unquoted, for matching errors' TableName

	schemaSQL, claimSQL, readSQL, gateSQL, expireSQL, takeoverSQL, recordSQL, reapSQL string

	// execSQL is a format: Exec puts the caller's statement and its
	// parameters' count in.
	execSQL string
	// statements keeps each statement given to Exec, wrapped (see
	// statement); plan chooses how Exec sends them.
	statements                  sync.Map      // string → wrapped
	describing                  chan struct{} // a semaphore: one describe at a time
	sharedTexts, describedTexts int           // guarded by describing
	isolation                   string        // default_transaction_isolation, guarded by describing
	plan                        plan
	gateName                    string
}

// Defaults for New.
const (
	DefaultTable     = "nolock_idempotency"
	DefaultRetention = 24 * time.Hour
	DefaultWait      = 5 * time.Second
	DefaultAttempts  = 3
	// MaxWait bounds WithWait: PostgreSQL's lock_timeout takes at most
	// 2^31-1 ms (about 24.8 days).
	MaxWait = math.MaxInt32 * time.Millisecond
	// MaxReapBatch bounds Reap's batch size.
	MaxReapBatch = 100_000
)

// expiresSuffix names the expiry index after the table; New keeps that
// name within PostgreSQL's identifier length (pgarg.Ident).
const expiresSuffix = "_expires_at"

//go:embed store.sql
var storeSQL string

// The statements, with {{table}} replaced by the quoted table name.
const (
	// claimSQL claims a key. Under Read Committed an insert that meets
	// another transaction's uncommitted row for the key waits for it: if it
	// rolls back, the insert claims the key; if it commits, the insert does
	// nothing. A committed row (live or expired) makes it do nothing at
	// once, without writing anything.
	//
	// The wait is bounded by lock_timeout ($5; NULL keeps the connection's
	// own) for this statement only: the source row sets it, saving the
	// connection's value, before the insert can wait, and RETURNING
	// restores it once the key is claimed (fn runs with the connection's
	// setting). When the claim fails, the transaction ends without fn, so
	// there is nothing to restore. All in one statement: each statement in
	// a pipeline costs as much as a small query.
	claimSQL = `INSERT INTO {{table}} (scope, key, fingerprint, expires_at)
SELECT $1, $2, $3, now() + $4::bigint * interval '1 microsecond'
FROM (SELECT set_config('nolock.lock_timeout', current_setting('lock_timeout'), true),
             set_config('lock_timeout', coalesce($5, current_setting('lock_timeout')), true)) AS bound
ON CONFLICT (scope, key) DO NOTHING
RETURNING created_at, expires_at, set_config('lock_timeout', current_setting('nolock.lock_timeout'), true)`
	// readSQL reads a key's record, whether it has expired and whether the
	// server has a synchronous standby (see found): the row a failed claim
	// met (with a snapshot taken after the claim's wait), or the one Get
	// and Exec look up. "+ interval '0 s'" keeps the planner
	// on the primary key rather than the expiry index.
	readSQL = `SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now(),
       current_setting('synchronous_standby_names') <> ''
FROM {{table}} WHERE scope = $1 AND key = $2`
	// expireSQL deletes an expired record, for Exec to insert a new one.
	// Its wait is bounded like the claim's: a takeover by Do holds the row.
	expireSQL = `DELETE FROM {{table}}
USING (SELECT set_config('lock_timeout', coalesce($3, current_setting('lock_timeout')), true)) AS bound
WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' <= now()`
	// takeoverSQL claims a key whose record has expired, in place, its wait
	// bounded like the claim's. Two takers queue on the row lock; the second
	// re-checks the row the first left and takes it only if the first
	// rolled back.
	takeoverSQL = `UPDATE {{table}} SET fingerprint = $3, terminal = false, result = NULL, created_at = now(),
  expires_at = now() + $4::bigint * interval '1 microsecond'
FROM (SELECT set_config('nolock.lock_timeout', current_setting('lock_timeout'), true),
             set_config('lock_timeout', coalesce($5, current_setting('lock_timeout')), true)) AS bound
WHERE scope = $1 AND key = $2 AND expires_at + interval '0 s' <= now()
RETURNING created_at, expires_at, set_config('lock_timeout', current_setting('nolock.lock_timeout'), true)`
	// recordSQL stores fn's result in the claimed row. It is pipelined with
	// COMMIT, so it must fail rather than update nothing if the row is gone
	// (fn deleted it): 1/0 raises, and the COMMIT behind it never runs.
	recordSQL = `WITH r AS (UPDATE {{table}} SET result = $3, terminal = $4 WHERE scope = $1 AND key = $2 RETURNING 1)
SELECT 1 / count(*) FROM r`
	reapSQL = `DELETE FROM {{table}} t USING (
  SELECT scope, key FROM {{table}} WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
) e WHERE t.scope = e.scope AND t.key = e.key AND t.expires_at <= now()`
)

// Option configures New and NewDynamoDB. Each option says which it
// applies to; the other refuses it with ErrInvalid.
type Option func(*config)

type config struct {
	table     string
	retention time.Duration
	wait      time.Duration
	attempts  int
	pk, sk    string
	now       func() time.Time
	pgOnly    string // the name of a PostgreSQL-only option used, if any
	dynamo    string // the name of a DynamoDB-only option used, if any
}

// WithTable sets the table's name (default "nolock_idempotency"), at most
// 52 bytes of UTF-8 without NUL (New refuses others). The name is quoted, never
// interpolated raw. Several Stores may share a table.
// PostgreSQL only: NewDynamoDB takes the table as an argument.
func WithTable(name string) Option {
	return func(c *config) { c.table, c.pgOnly = name, "WithTable" }
}

// WithRetention sets how long a record counts after its key is claimed
// (default 24 h): after that the key is treated as unused, and Reap may
// delete the record. Each record keeps the expiry it was written with, so
// Stores with different retentions may share a table.
func WithRetention(d time.Duration) Option { return func(c *config) { c.retention = d } }

// WithWait bounds how long Do waits for a concurrent request with the same
// key to finish (default 5 s) before returning ErrInProgress. 0 means until
// the context ends. On PostgreSQL a context deadline shortens it, so that
// the database gives up first and the connection survives; on DynamoDB it
// bounds the retries of a transaction that meets concurrent ones.
func WithWait(d time.Duration) Option { return func(c *config) { c.wait = d } }

// WithAttempts bounds how many times Do runs the transaction when it fails
// with a deadlock or a serialization failure (default 3; 1 means never
// retry). Each retry starts from a full rollback. PostgreSQL only.
func WithAttempts(n int) Option {
	return func(c *config) { c.attempts, c.pgOnly = n, "WithAttempts" }
}

// WithKeyAttributes names the DynamoDB table's partition key attribute
// (default "pk") and its sort key attribute ("" for none, the default;
// with one, records use the sort key value "nolock-idem"). DynamoDB only.
func WithKeyAttributes(partition, sort string) Option {
	return func(c *config) { c.pk, c.sk, c.dynamo = partition, sort, "WithKeyAttributes" }
}

// WithClock sets the clock that judges expiry on DynamoDB (default
// time.Now). DynamoDB only: PostgreSQL judges expiry by the database's
// now().
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now, c.dynamo = now, "WithClock" }
}

func newConfig(opts []Option) (config, error) {
	cfg := config{table: DefaultTable, retention: DefaultRetention, wait: DefaultWait, attempts: DefaultAttempts,
		pk: "pk", now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case cfg.table == "":
		return cfg, invalid("table is empty")
	case cfg.retention <= 0:
		return cfg, invalid("retention %v is not positive", cfg.retention)
	case cfg.retention < time.Millisecond:
		return cfg, invalid("retention %v is below 1ms", cfg.retention)
	case cfg.wait < 0:
		return cfg, invalid("wait %v is negative", cfg.wait)
	case cfg.wait > MaxWait:
		return cfg, invalid("wait %v is over %v, PostgreSQL's longest lock_timeout", cfg.wait, MaxWait)
	case cfg.attempts < 1 || cfg.attempts > 100:
		return cfg, invalid("attempts %d outside [1, 100]", cfg.attempts)
	}
	return cfg, nil
}

// New returns a Store on db, usually a *pgxpool.Pool. db must not be a
// transaction: Do begins and commits its own. Run CreateSchema (or put
// Schema in your migrations) first.
func New(db DB, opts ...Option) (*Store, error) {
	if pgarg.NilDB(db) {
		return nil, invalid("db is nil")
	}
	if _, ok := db.(pgx.Tx); ok {
		return nil, invalid("db is a transaction; pass a pool")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.dynamo != "" {
		return nil, invalid("%s applies to DynamoDB only", cfg.dynamo)
	}
	// The server would cut longer names (and the index's) short, and Exec
	// would not recognise its own table in errors.
	if err := pgarg.Ident("table", cfg.table, len(expiresSuffix)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	table := pgx.Identifier{cfg.table}.Sanitize()
	sql := strings.NewReplacer("{{table}}", table,
		"{{expires_index}}", pgx.Identifier{cfg.table + expiresSuffix}.Sanitize()).Replace
	return &Store{
		db: db, over: pgmode.For(db), execSQL: strings.ReplaceAll(execSQL, "{{table}}", strings.ReplaceAll(table, "%", "%%")),
		retention: cfg.retention, wait: cfg.wait, policy: backoff.Policy{Attempts: cfg.attempts},
		schemaSQL: sql(storeSQL), table: cfg.table, claimSQL: sql(claimSQL), readSQL: sql(readSQL), gateSQL: sql(gateSQL), gateName: preparedName(sql(gateSQL)), describing: make(chan struct{}, 1), expireSQL: sql(expireSQL),
		takeoverSQL: sql(takeoverSQL), recordSQL: sql(recordSQL), reapSQL: sql(reapSQL),
	}, nil
}

// Schema returns the DDL of the Store's table, for migration tools.
func (s *Store) Schema() string { return s.schemaSQL }

// CreateSchema creates the Store's table and index if they do not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (s *Store) CreateSchema(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := pgschema.Create(ctx, s.db, s.schemaSQL); err != nil {
		return fmt.Errorf("idempotency: create schema: %w", err)
	}
	return nil
}

// Do runs fn at most once per (scope, key): it claims the key, runs fn,
// and stores fn's result with the key, in one transaction (Read Committed).
//
//   - A key not used yet (or whose record expired): fn runs; if it
//     succeeds, or fails with an error marked Terminal, its writes and the
//     record commit together and Do returns the result (Replayed false,
//     nil error). Any other error of fn rolls everything back, stores
//     nothing and is returned as is: retrying with the same key is safe.
//   - A key with a live record and the same fingerprint: fn does not run;
//     Do returns the stored result with Replayed set. A replay writes
//     nothing and takes no lock; on a server with a synchronous standby
//     it returns once the standby holds the record (a record whose own
//     wait for the standby was cancelled is never acknowledged before).
//   - A key with a live record and another fingerprint: fn does not run;
//     Do returns a *MismatchError holding the stored record (ErrMismatch).
//   - A key claimed by a transaction still running (a concurrent
//     duplicate): Do waits for it, bounded by WithWait and ctx's deadline.
//     If it commits, Do replays its result (or reports a mismatch); if it
//     rolls back, Do claims the key and runs fn. If the bound runs out, Do
//     returns ErrInProgress and nothing ran.
//
// ErrAmbiguousCommit means the connection failed after COMMIT was sent;
// call Do again with the same key to learn the outcome: it replays the
// result if the commit happened and runs fn if it did not. Cancelling ctx
// before the commit rolls back. Once fn has returned, the commit is never
// cancelled: no CancelRequest cuts it short (a cancelled wait for a
// synchronous standby would leave it visible but not replicated). If ctx
// ends while it is in flight, Do stops waiting and returns
// ErrAmbiguousCommit; the commit goes on to its end on the server's terms.
//
// Arguments are checked before any I/O (ErrInvalid): key must be 1 to
// MaxKeyLen bytes, scope at most MaxScopeLen ("" is a scope like any
// other), both UTF-8 without NUL; fingerprint at most MaxFingerprintLen
// bytes (nil equals empty; see Fingerprint); fn not nil.
//
// Do does not promise anything about effects fn makes outside tx, and does
// not detect a fingerprint collision: use a cryptographic hash.
func (s *Store) Do(ctx context.Context, scope, key string, fingerprint []byte, fn Func) (Result, error) {
	if err := checkCtx(ctx); err != nil {
		return Result{}, err
	}
	if err := validRequest(scope, key, fingerprint, fn == nil); err != nil {
		return Result{}, err
	}
	if fingerprint == nil {
		fingerprint = []byte{}
	}
	var res Result
	err := s.policy.Retry(ctx, func(ctx context.Context, _ int) error {
		var err error
		res, err = settled(ctx, func() (Result, error) { return s.once(ctx, scope, key, fingerprint, fn) })
		return err
	}, retryable, nil)
	var exhausted *backoff.ExhaustedError
	if errors.As(err, &exhausted) {
		return Result{}, fmt.Errorf("idempotency: key %q: %w", key, err)
	}
	return res, err
}

// errVanished means the record that stood in the way of a claim (Do) or
// an insert (Exec) was gone or expired by the time it was read: the
// attempt is made again.
var errVanished = errors.New("idempotency: the key's record vanished while in the way")

// settled runs attempt again (up to 10 times, while ctx lives) as long as
// it ends in errVanished: fn did not run then (an Exec statement may have,
// and rolled back, as its record was in the way or its prepared statement
// stale), so these do not count against WithAttempts, which bounds runs of
// the effect that rolled back.
func settled(ctx context.Context, attempt func() (Result, error)) (Result, error) {
	for i := 0; ; i++ {
		res, err := attempt()
		if !errors.Is(err, errVanished) || i == 9 || ctx.Err() != nil {
			return res, err
		}
	}
}

// retryable reports whether Do may run the whole transaction again: it
// rolled back for a reason a new attempt may not meet.
func retryable(err error) bool {
	if errors.Is(err, ErrAmbiguousCommit) {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.Is(err, errVanished) ||
		errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// once is one attempt of Do. A first run costs two round trips besides
// fn's own (begin and claim; record and commit), as many as a bare
// transaction; a replay costs two (begin and claim; read and commit).
func (s *Store) once(ctx context.Context, scope, key string, fp []byte, fn Func) (Result, error) {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
	}
	// A connection left inside a transaction is closed, not reused. The
	// commit releases it itself: it may outlive this call (see below).
	release := c.Release
	defer func() {
		if release != nil {
			release()
		}
	}()
	conn := c.Conn()

	rec := Record{Scope: scope, Key: key, Fingerprint: fp}
	tx, claimed, err := s.claim(ctx, conn, s.claimSQL, &rec)
	if err != nil {
		return Result{}, err
	}
	if !claimed {
		// Read the row the claim met, and end the transaction.
		var stored found
		var ok bool
		b := &pgx.Batch{}
		b.Queue(s.readSQL, scope, key).QueryRow(func(row pgx.Row) error {
			err := stored.scan(row)
			ok = err == nil
			return noRows(err)
		})
		// The read's transaction commits after a statement that writes
		// WAL when the server has a synchronous standby: its COMMIT then
		// returns only once the standby holds all WAL up to it, the
		// record's commit included, so a replay never acknowledges a record
		// that a failover could lose (one whose own wait for the standby
		// was cancelled). Without a synchronous standby it commits nothing.
		b.Queue(syncMarkSQL)
		b.Queue("commit")
		err := detached(ctx, &release, func(ctx context.Context) error {
			err := conn.SendBatch(ctx, b).Close()
			end(ctx, conn, tx)
			return err
		})
		switch {
		case errors.Is(err, pgerr.ErrStoppedWaiting):
			return Result{}, fmt.Errorf("idempotency: key %q: stopped waiting for its record to reach the synchronous standby; nothing was run: %w", key, err)
		case err != nil:
			return Result{}, fmt.Errorf("idempotency: read %q: %w", key, err)
		case !ok: // gone already (reaped): start over
			return Result{}, errVanished
		case !stored.expired:
			stored.Scope, stored.Key = scope, key
			return replayOf(stored.Record, fp)
		}
		// An expired record counts as absent: take the key over.
		if tx, claimed, err = s.claim(ctx, conn, s.takeoverSQL, &rec); err != nil {
			return Result{}, err
		}
		if !claimed { // another taker committed first, or it was reaped
			end(ctx, conn, tx)
			return Result{}, errVanished
		}
	}

	ftx := &fnTx{Tx: tx, closed: new(atomic.Bool)}
	body, ferr := func() ([]byte, error) {
		defer ftx.closed.Store(true)
		return fn(ctx, ftx)
	}()
	terminal := ferr != nil && isTerminal(ferr)
	if ferr != nil && !terminal {
		rollback(ctx, tx)
		return Result{}, ferr
	}
	switch conn.PgConn().TxStatus() {
	case 'T':
	case 'E':
		rollback(ctx, tx)
		return Result{}, fmt.Errorf("idempotency: key %q: fn returned success but a statement of its transaction failed; rolled back", key)
	default:
		return Result{}, fmt.Errorf("idempotency: key %q: fn ended the transaction itself; its effect may have committed without the key", key)
	}

	// Store the result and commit, in one round trip. The commit runs to
	// its end on the server's terms even if the caller stops waiting (see
	// detached).
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(s.recordSQL, scope, key, body, terminal)
	b.Queue("commit").Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	err = detached(ctx, &release, func(ctx context.Context) error {
		err := conn.SendBatch(ctx, b).Close()
		if err != nil {
			end(ctx, conn, tx) // when the record failed, the COMMIT was skipped
		}
		return err
	})
	if err != nil {
		return Result{}, commitError(key, err)
	}
	if tag.String() != "COMMIT" {
		return Result{}, fmt.Errorf("idempotency: key %q: commit rolled back (%s)", key, tag)
	}
	rec.Body, rec.Terminal = body, terminal
	return Result{Record: rec}, nil
}

// syncMarkSQL writes a WAL record in its transaction (a transactional
// logical message, ignored by logical decoding unless asked for) when the
// server has a synchronous standby: PostgreSQL makes a COMMIT wait for the
// standby only when its transaction wrote WAL, so the transaction's COMMIT
// then waits until the standby holds the WAL up to it.
const syncMarkSQL = `SELECT pg_logical_emit_message(true, 'nolock', '') WHERE current_setting('synchronous_standby_names') <> ''`

// detached runs fn, which ends with a commit on the connection *release
// releases, under pgerr.Commit: ctx cannot cancel it. If ctx ends first,
// detached returns pgerr.ErrStoppedWaiting at once, sets *release to nil
// and leaves the release to fn's goroutine, which releases the connection
// when fn returns. Otherwise the connection stays with the caller.
func detached(ctx context.Context, release *func(), fn func(context.Context) error) error {
	var mu sync.Mutex
	left, ended := false, false
	done := *release
	err := pgerr.Commit(ctx, func(ctx context.Context) error {
		err := fn(ctx)
		mu.Lock()
		defer mu.Unlock()
		if ended = true; left {
			done()
		}
		return err
	})
	if errors.Is(err, pgerr.ErrStoppedWaiting) {
		mu.Lock()
		defer mu.Unlock()
		*release = nil
		if left = true; ended {
			done()
		}
	}
	return err
}

// claim begins a transaction on conn and runs the claim (or takeover)
// statement sql in the same round trip, filling rec's times when it claims
// the key. The transaction is left open either way, unless an error is
// returned.
func (s *Store) claim(ctx context.Context, conn *pgx.Conn, sql string, rec *Record) (tx pgx.Tx, claimed bool, err error) {
	wait, bound := s.bound(ctx)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	var restored string
	b.Queue(sql, rec.Scope, rec.Key, rec.Fingerprint, s.retention.Microseconds(), bound).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&rec.CreatedAt, &rec.ExpiresAt, &restored)
		claimed = err == nil
		return noRows(err)
	})
	br := conn.SendBatch(ctx, b)
	tx = br.Tx()
	if err := br.Close(); err != nil {
		end(ctx, conn, tx)
		return nil, false, claimError(rec.Key, wait, err)
	}
	return tx, claimed, nil
}

// end rolls back tx unless conn is already outside a transaction.
func end(ctx context.Context, conn *pgx.Conn, tx pgx.Tx) {
	if conn.PgConn().TxStatus() != 'I' {
		rollback(ctx, tx)
	}
}

// noRows turns "no row" into nil: a claim that met a row returns none.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	return err
}

// claimError classifies a failed claim: lock_timeout (55P03) while waiting
// for a concurrent duplicate is ErrInProgress. Nothing was committed.
func claimError(key string, wait time.Duration, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return fmt.Errorf("%w: key %q, waited %v", ErrInProgress, key, wait)
	}
	return fmt.Errorf("idempotency: claim %q: %w", key, pgmode.Explain(err))
}

// commitError classifies a failed record-and-commit round trip by what it
// proves (see pgerr.Of): the connection lost, a timeout, a FATAL such as
// pg_terminate_backend, or the caller no longer waiting may have come after
// the commit: ErrAmbiguousCommit. Anything else rolled the transaction
// back: the server refused a statement (a failed record, a deferred
// constraint, a serialization failure), or nothing was sent.
func commitError(key string, err error) error {
	if !pgerr.Ambiguous(err) {
		return fmt.Errorf("idempotency: commit %q: rolled back: %w", key, pgmode.Explain(err))
	}
	return fmt.Errorf("%w: key %q: %w", ErrAmbiguousCommit, key, err)
}

// waitFor returns the lock_timeout for the claim: the Store's wait,
// shortened to 90 % of what is left before ctx's deadline, so that the
// server gives up before the client drops the connection. 0: no bound.
func (s *Store) waitFor(ctx context.Context) time.Duration {
	w := s.wait
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left -= left / 10; w == 0 || left < w {
			w = max(left, time.Millisecond)
		}
	}
	return min(w, MaxWait) // lock_timeout's limit
}

// bound returns waitFor(ctx) and the lock_timeout parameter of a claim's
// or Exec's statement for it: milliseconds as text, or nil (no bound)
// to keep the connection's.
func (s *Store) bound(ctx context.Context) (time.Duration, any) {
	wait := s.waitFor(ctx)
	if wait <= 0 {
		return 0, nil
	}
	return wait, strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
}

// rollback ends tx even when ctx is cancelled. A failure closes the
// connection, which the pool then drops; a closed tx returns ErrTxClosed.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// Get returns the live record of (scope, key), or ErrNotFound. It is a
// snapshot: useful after ErrAmbiguousCommit, or to show a key's outcome.
func (s *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	if err := checkCtx(ctx); err != nil {
		return Record{}, err
	}
	if err := validRequest(scope, key, nil, false); err != nil {
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

// found is a key's record as readSQL reads it: whether it has expired by
// the database's clock, and whether that server has a synchronous standby.
type found struct {
	Record
	expired, standby bool
}

// scan reads readSQL's columns (gateSQL's have the same layout).
func (f *found) scan(row interface{ Scan(...any) error }) error {
	return row.Scan(&f.Fingerprint, &f.Terminal, &f.Body, &f.CreatedAt, &f.ExpiresAt, &f.expired, &f.standby)
}

// lookup returns the record of (scope, key), live or expired; ErrNotFound
// if there is none.
func (s *Store) lookup(ctx context.Context, scope, key string) (found, error) {
	f := found{Record: Record{Scope: scope, Key: key}}
	err := f.scan(s.db.QueryRow(ctx, s.readSQL, s.over.Args(scope, key)...))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return found{}, ErrNotFound
	case err != nil:
		return found{}, fmt.Errorf("idempotency: get %q: %w", key, pgmode.Explain(err))
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
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	if batch <= 0 || batch > MaxReapBatch {
		return 0, invalid("batch %d outside [1, %d]", batch, MaxReapBatch)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		tag, err := s.db.Exec(ctx, s.reapSQL, s.over.Args(batch)...)
		if err != nil {
			return total, fmt.Errorf("idempotency: reap: %w", pgmode.Explain(err))
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}
