package pgcas

import (
	"context"
	_ "embed"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
)

// DB is what Backend needs from pgx: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx satisfies it. It may grow in later versions. NewBackend accepts
// those three; what each gives:
//
//   - A pool: each operation is one statement that commits on its own, on
//     a connection of its own, concurrently with the others. A commit
//     whose caller stopped waiting runs on, and Close waits for it.
//   - A *pgx.Conn: the same, one statement at a time: the Backend's
//     operations (a Store's concurrent Updates and its combined batches)
//     queue for the connection, and you must not use it yourself while
//     one runs. A Create, Put or Delete waits for its statement to end,
//     whatever its ctx does (at most pgoutcome.CommitTimeout), so that
//     nothing runs on the connection once it returned; a Get whose ctx
//     ends while it runs has pgx close the connection, after which every
//     operation fails.
//   - A pgx.Tx, your transaction: the operations queue for it too, and
//     commit nothing: a Create, Put or Delete is applied in your
//     transaction, and is durable, and visible to others, only once you
//     commit it (a rollback takes it back). The rows it wrote stay locked
//     until then, so another writer of the key waits for your
//     transaction. It never reports cas.ErrAmbiguousCommit (your COMMIT
//     decides). A statement that fails aborts your transaction; a lost
//     compare-and-set does not (it changes no row).
//
// A wrapper of yours that NewBackend cannot see through is taken as is, as
// a pool: it must then be safe for concurrent use and commit each
// statement on its own.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

//go:embed postgres.sql
var postgresSQL string

// DefaultTable is Backend's table unless NewBackend is given
// another name.
const DefaultTable = "nolock_cas"

// Backend stores records in one table (key text, version bigint,
// value bytea), every operation one autocommitted statement.
//
// A commit whose caller stopped waiting (its ctx ended) runs on to its end
// on a goroutine of the backend, at most pgoutcome.CommitTimeout; Close
// (which the Store's Close calls) waits for those.
type Backend struct {
	db                                           DB
	pg                                           *pgerr.Committer // its writes; Close waits for their commits
	over                                         pgmode.Override  // for db's statements
	turn                                         chan struct{}    // one statement at a time on a *pgx.Conn or pgx.Tx; nil on a pool
	inTx                                         bool             // db is a pgx.Tx
	schema, getSQL, createSQL, putSQL, deleteSQL string
}

// Option changes a Backend's setting from its default: WithTable.
type Option func(*backendConfig)

type backendConfig struct{ table string }

// WithTable names the backend's table (default DefaultTable): one
// identifier of at most 63 bytes, found through the search_path, always
// quoted, never interpolated raw.
func WithTable(name string) Option { return func(c *backendConfig) { c.table = name } }

// NewBackend returns a Backend on db: a *pgxpool.Pool (the usual), a
// *pgx.Conn or a pgx.Tx (see DB for what each gives). Run its CreateSchema (or put
// its Schema in your migrations) first. A nil db, a nil option or a table
// name WithTable cannot use is cas.ErrInvalid, naming it.
func NewBackend(db DB, opts ...Option) (*Backend, error) {
	if pgarg.NilDB(db) {
		return nil, casstore.Invalid("db is nil")
	}
	cfg := backendConfig{table: DefaultTable}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", cas.ErrInvalid, err)
	}
	table := cfg.table
	if err := pgarg.Ident("WithTable", table, 0); err != nil {
		return nil, errfmt.Errorf("%w: %w", cas.ErrInvalid, err)
	}
	t := pgx.Identifier{table}.Sanitize()
	pg := new(pgerr.Committer)
	var turn chan struct{}
	if pgarg.Single(db) != "" {
		pg = pgerr.Inline() // each operation waits for its commit: the handle is free when it returns
		turn = make(chan struct{}, 1)
	}
	_, inTx := db.(pgx.Tx)
	return &Backend{
		db:        db,
		pg:        pg,
		over:      pg.For(db),
		turn:      turn,
		inTx:      inTx,
		schema:    strings.ReplaceAll(postgresSQL, "{{table}}", t),
		getSQL:    `SELECT value, version FROM ` + t + ` WHERE key = $1`,
		createSQL: `INSERT INTO ` + t + ` (key, version, value) VALUES ($1, 1, $2) ON CONFLICT (key) DO NOTHING`,
		// The CTE reads the row as it was when the statement began, to tell
		// a conflict from a missing row without a second round trip.
		putSQL: `WITH cur AS (SELECT version FROM ` + t + ` WHERE key = $1),
 upd AS (UPDATE ` + t + ` SET value = $2, version = version + 1 WHERE key = $1 AND version = $3 RETURNING version)
SELECT (SELECT version FROM upd), EXISTS (SELECT 1 FROM cur)`,
		deleteSQL: `WITH cur AS (SELECT version FROM ` + t + ` WHERE key = $1),
 del AS (DELETE FROM ` + t + ` WHERE key = $1 AND version = $2 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM del), EXISTS (SELECT 1 FROM cur)`,
	}, nil
}

// Schema returns the table's DDL, for migration tools.
func (p *Backend) Schema() string { return p.schema }

// CreateSchema creates the table if it does not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (p *Backend) CreateSchema(ctx context.Context) error {
	if err := casstore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := p.take(ctx, "create schema", ""); err != nil {
		return errfmt.Errorf("cas: create schema: %w", ctx.Err())
	}
	defer p.give()
	if err := pgschema.Create(ctx, p.db, p.schema); err != nil {
		return errfmt.Errorf("cas: create schema: %w", err)
	}
	return nil
}

// Close waits for the commits in flight whose callers stopped waiting
// (each bounded by pgoutcome.CommitTimeout). A Store's Close calls it. It
// is idempotent and safe to call concurrently; a write after Close still
// works, its caller waiting for its commit whatever ctx does. The database
// handle is the caller's to close.
func (p *Backend) Close() error {
	p.pg.Close()
	return nil
}

// MaxValue is 64 MiB: bytea takes up to 1 GiB, but a CAS value that large
// would make every retry expensive.
func (p *Backend) MaxValue() int { return 64 << 20 }

// Get implements cas.Backend.
func (p *Backend) Get(ctx context.Context, key string) ([]byte, int64, error) {
	if err := casstore.CheckCtx(ctx); err != nil {
		return nil, 0, err
	}
	if err := p.take(ctx, "get", key); err != nil {
		return nil, 0, err
	}
	defer p.give()
	var b []byte
	var ver int64
	err := p.over.QueryRow(ctx, p.db, p.getSQL, key).Scan(&b, &ver)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, cas.ErrNotFound
	}
	if err != nil {
		return nil, 0, errfmt.Errorf("cas: get %q: %w", key, pgmode.Explain(err))
	}
	return b, ver, nil
}

// Create implements cas.Backend.
func (p *Backend) Create(ctx context.Context, key string, value []byte) error {
	if err := p.take(ctx, "create", key); err != nil {
		return err
	}
	defer p.give()
	tag, err := p.pg.Exec(ctx, p.db, p.createSQL, p.over.Args(key, value)...)
	if err != nil {
		return errfmt.Errorf("cas: create %q: %w", key, p.ambiguous(err))
	}
	if tag.RowsAffected() == 0 {
		return cas.ErrExists
	}
	return nil
}

// Put implements cas.Backend.
func (p *Backend) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := p.take(ctx, "put", key); err != nil {
		return 0, err
	}
	defer p.give()
	var ver *int64
	var existed bool
	if err := p.pg.Row(ctx, p.db, p.putSQL, p.over.Args(key, value, version)...).Scan(&ver, &existed); err != nil {
		return 0, errfmt.Errorf("cas: put %q: %w", key, p.ambiguous(err))
	}
	switch {
	case ver != nil:
		return *ver, nil
	case !existed:
		return 0, cas.ErrNotFound
	}
	return 0, cas.ErrConflict
}

// Delete implements cas.Backend.
func (p *Backend) Delete(ctx context.Context, key string, version int64) error {
	if err := p.take(ctx, "delete", key); err != nil {
		return err
	}
	defer p.give()
	var deleted, existed bool
	if err := p.pg.Row(ctx, p.db, p.deleteSQL, p.over.Args(key, version)...).Scan(&deleted, &existed); err != nil {
		return errfmt.Errorf("cas: delete %q: %w", key, p.ambiguous(err))
	}
	switch {
	case deleted:
		return nil
	case !existed:
		return cas.ErrNotFound
	}
	return cas.ErrConflict
}

// take waits for p's turn on a *pgx.Conn or pgx.Tx (see DB), and returns an
// error saying that op on key was not sent if ctx ends first; give ends
// the turn.
func (p *Backend) take(ctx context.Context, op, key string) error {
	if err := casstore.NotSent(ctx, op, key); err != nil || p.turn == nil {
		return err
	}
	select {
	case p.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return casstore.NotSent(ctx, op, key)
	}
}

func (p *Backend) give() {
	if p.turn != nil {
		<-p.turn
	}
}

// ambiguous wraps err with cas.ErrAmbiguousCommit when the statement may have
// committed before the connection failed: never inside the caller's
// transaction, where nothing commits until the caller does.
func (p *Backend) ambiguous(err error) error {
	if !p.inTx && pgerr.Ambiguous(err) {
		return errfmt.Errorf("%w: %w", cas.ErrAmbiguousCommit, err)
	}
	return pgmode.Explain(err)
}
