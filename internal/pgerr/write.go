package pgerr

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Querier runs statements: a pool, a connection, a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// acquirer is a pool: Exec and Row take a connection from it under the
// caller's ctx, so a full pool is waited for no longer than the caller
// waits, and a failed Acquire is known to have sent nothing.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Exec runs one statement on db. Outside a transaction the statement
// commits on its own, so it runs under c.Commit: the caller's ctx bounds
// the wait for a pooled connection and for the answer, but cannot cancel
// the statement on the server. Inside a transaction (db is a pgx.Tx)
// nothing commits, and it runs under ctx as is.
func (c *Committer) Exec(ctx context.Context, db Querier, sql string, args ...any) (pgconn.CommandTag, error) {
	type result struct {
		tag pgconn.CommandTag
		err error
	}
	var res result
	err := c.write(ctx, db, args, func(ctx context.Context, q Querier, args []any) error {
		tag, err := q.Exec(ctx, sql, args...)
		res = result{tag, err}
		return err
	})
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return res.tag, nil
}

// Row is QueryRow for a statement that writes: its Scan runs the statement
// as Exec does. On an error from Scan, dest may still be written until
// the statement ends: do not read it.
func (c *Committer) Row(ctx context.Context, db Querier, sql string, args ...any) pgx.Row {
	return committingRow{c, ctx, db, sql, args}
}

type committingRow struct {
	c    *Committer
	ctx  context.Context
	db   Querier
	sql  string
	args []any
}

func (r committingRow) Scan(dest ...any) error {
	return r.c.write(r.ctx, r.db, r.args, func(ctx context.Context, q Querier, args []any) error {
		return q.QueryRow(ctx, r.sql, args...).Scan(dest...)
	})
}

// write runs stmt with args on db (on a connection acquired from it, for a
// pool) under c.Commit, or directly inside a transaction. Outside a
// transaction, a statement that failed because the server connection did
// not keep pgx's named prepared statement ran nothing: it is sent again at
// once, unnamed (see pgmode.Modes.Learn).
func (c *Committer) write(ctx context.Context, db Querier, args []any, stmt func(context.Context, Querier, []any) error) error {
	if _, ok := db.(pgx.Tx); ok {
		return stmt(ctx, db, args)
	}
	once := func(ctx context.Context, q Querier) error {
		err := stmt(ctx, q, args)
		if c.Learn(q, err) {
			err = stmt(ctx, q, c.ForEach(q).Args(args...))
		}
		return err
	}
	if p, ok := db.(acquirer); ok {
		conn, err := p.Acquire(ctx)
		if err != nil {
			return MarkUnsent(err)
		}
		return c.CommitBounded(ctx, func(ctx context.Context) error {
			defer conn.Release()
			defer Bound(conn.Conn().PgConn())()
			return once(ctx, conn)
		})
	}
	return c.Commit(ctx, func(ctx context.Context) error { return once(ctx, db) })
}

// Beginner starts transactions: a pool, a connection, or a transaction
// (for a nested one, a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Tx is a pgx.Tx whose Commit runs under its Committer's Commit: the
// caller's ctx bounds the wait for the COMMIT's answer but cannot cancel
// it on the server. A Rollback after Commit was called does nothing, so
// the usual deferred Rollback stays safe while a commit outlives the
// caller's wait.
type Tx struct {
	pgx.Tx
	c          *Committer
	nested     bool // a savepoint in the caller's transaction: nothing commits
	committing bool
}

// Begin begins a transaction on db (a savepoint if db is a transaction).
func (c *Committer) Begin(ctx context.Context, db Beginner) (*Tx, error) {
	_, nested := db.(pgx.Tx)
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{Tx: tx, c: c, nested: nested}, nil
}

// Commit commits the transaction under its Committer's Commit (a nested one, whose commit
// only releases a savepoint, under ctx as is).
func (t *Tx) Commit(ctx context.Context) error {
	t.committing = true
	if t.nested {
		return t.Tx.Commit(ctx)
	}
	return t.c.Commit(ctx, t.Tx.Commit)
}

// Exec, Query and QueryRow send a statement in the transaction unnamed
// when its Committer knows its endpoint not to keep named prepared
// statements (see pgmode), and learn that from the statement's failure.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, t.c.ForEach(t.Tx).Args(args...)...)
	t.c.Learn(t.Tx, err)
	return tag, err
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, t.c.ForEach(t.Tx).Args(args...)...)
	t.c.Learn(t.Tx, err)
	return rows, err
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return learningRow{t.Tx.QueryRow(ctx, sql, t.c.ForEach(t.Tx).Args(args...)...), t}
}

// learningRow is a row whose Scan learns from its error (see
// pgmode.Modes.Learn).
type learningRow struct {
	pgx.Row
	t *Tx
}

func (r learningRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.t.c.Learn(r.t.Tx, err)
	return err
}

// Handed returns the transaction to hand a caller's function (an inbox or
// partition handler): the pgx.Tx the caller's DB began, as is, so the
// function can type-assert its own Tx type; t itself only where the
// transaction's connection is in cache_statement mode on an endpoint
// learnt not to keep named prepared statements (Modes.Unnamed: PgBouncer
// before 1.21, or a DISCARD ALL), where t sends the function's statements
// unnamed so that they do not fail at random. Pass the function's error to
// Learn, which learns what t's own statements would have.
func (t *Tx) Handed() pgx.Tx {
	if t.c.Unnamed(t.Tx) {
		return t
	}
	return t.Tx
}

// Learn learns from err, the error of a function handed Handed(): a
// statement it sent named that the server connection did not keep (see
// pgmode.Modes.Learn). The next transaction's Handed then returns the
// wrapper.
func (t *Tx) Learn(err error) { t.c.Learn(t.Tx, err) }

// Rollback rolls the transaction back unless Commit was called.
func (t *Tx) Rollback(ctx context.Context) error {
	if t.committing {
		return nil
	}
	return t.Tx.Rollback(ctx)
}
