// Package pgschema runs nolock's schema DDL so that concurrent callers do
// not collide. PostgreSQL's CREATE TABLE IF NOT EXISTS and CREATE INDEX IF
// NOT EXISTS are not safe against each other: two sessions that both find
// the name free both create it, and one fails with 23505 on a system
// catalog's unique index (pg_type_typname_nsp_index). Here every DDL run
// takes one transaction-scoped advisory lock first, the same for all of
// nolock, so the runs follow one another and each later one finds the
// objects the earlier ones committed.
package pgschema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgerr"
)

// LockKey is the pg_advisory_xact_lock key that serialises nolock's DDL:
// the bytes of "nolockDD". Another application using the same key would
// only wait behind a schema creation.
const LockKey int64 = 0x6e6f6c6f636b4444

var lockSQL = fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", LockKey)

// Execer runs statements: a pool, a connection, a transaction.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Beginner starts transactions: a pool, a connection, or a transaction
// (then a savepoint, and the lock is held until the caller's transaction
// ends).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Create runs ddl (one or more statements, no parameters) in one
// transaction holding the schema lock. If db can begin transactions (every
// pgx type can), it is CreateWith; otherwise the lock and ddl go to db as
// one multi-statement string without arguments, which pgx sends in the
// simple protocol, where PostgreSQL runs it as one implicit transaction.
func Create(ctx context.Context, db Execer, ddl string) error {
	if b, ok := db.(Beginner); ok {
		return CreateWith(ctx, b, ddl)
	}
	_, err := db.Exec(ctx, lockSQL+";\n"+ddl)
	return err
}

// CreateWith runs ddl in a transaction begun on db, after taking the
// schema lock in it. The commit runs under pgerr.Inline: ctx does not
// cancel it, and CreateWith waits for its end (at most
// pgerr.CommitTimeout).
func CreateWith(ctx context.Context, db Beginner, ddl string) error {
	tx, err := pgerr.Inline().Begin(ctx, db)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		return errfmt.Errorf("schema lock: %w", err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
