package pgcas

import (
	"context"
	_ "embed"
	"errors"
	"strings"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
)

// DB is what Backend needs from pgx: a *pgxpool.Pool or a
// *pgx.Conn. It may grow in later versions.
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
	schema, getSQL, createSQL, putSQL, deleteSQL string
}

// Option changes a Backend's setting from its default: WithTable.
type Option func(*backendConfig)

type backendConfig struct{ table string }

// WithTable names the backend's table (default DefaultTable): one
// identifier of at most 63 bytes, found through the search_path, always
// quoted, never interpolated raw.
func WithTable(name string) Option { return func(c *backendConfig) { c.table = name } }

// NewBackend returns a Backend on db. Run its CreateSchema (or put
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
	return &Backend{
		db:        db,
		pg:        pg,
		over:      pg.For(db),
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
	if err := casstore.NotSent(ctx, "create", key); err != nil {
		return err
	}
	tag, err := p.pg.Exec(ctx, p.db, p.createSQL, p.over.Args(key, value)...)
	if err != nil {
		return errfmt.Errorf("cas: create %q: %w", key, ambiguous(err))
	}
	if tag.RowsAffected() == 0 {
		return cas.ErrExists
	}
	return nil
}

// Put implements cas.Backend.
func (p *Backend) Put(ctx context.Context, key string, value []byte, version int64) (int64, error) {
	if err := casstore.NotSent(ctx, "put", key); err != nil {
		return 0, err
	}
	var ver *int64
	var existed bool
	if err := p.pg.Row(ctx, p.db, p.putSQL, p.over.Args(key, value, version)...).Scan(&ver, &existed); err != nil {
		return 0, errfmt.Errorf("cas: put %q: %w", key, ambiguous(err))
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
	if err := casstore.NotSent(ctx, "delete", key); err != nil {
		return err
	}
	var deleted, existed bool
	if err := p.pg.Row(ctx, p.db, p.deleteSQL, p.over.Args(key, version)...).Scan(&deleted, &existed); err != nil {
		return errfmt.Errorf("cas: delete %q: %w", key, ambiguous(err))
	}
	switch {
	case deleted:
		return nil
	case !existed:
		return cas.ErrNotFound
	}
	return cas.ErrConflict
}

// ambiguous wraps err with cas.ErrAmbiguousCommit when the statement may have
// committed before the connection failed.
func ambiguous(err error) error {
	if pgerr.Ambiguous(err) {
		return errfmt.Errorf("%w: %w", cas.ErrAmbiguousCommit, err)
	}
	return pgmode.Explain(err)
}
