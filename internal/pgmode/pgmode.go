// Package pgmode makes nolock's own statements safe in every pgx query
// mode, through a transaction pooler (PgBouncer in transaction pooling)
// too, and explains the errors of the one mode such a pooler cannot serve.
//
// In pgx.QueryExecModeDescribeExec, pgx runs a statement in two round
// trips: the first prepares it as the unnamed statement and describes it,
// the second binds and executes the unnamed statement. Outside a
// transaction a pooler may hand the second round trip to another server
// connection, whose unnamed statement is another client's: the bind then
// fails (08P01 "bind message supplies N parameters") or, when the
// parameters fit, runs that other statement with these arguments. So
// nolock sends each statement of its own that may run outside a
// transaction, on a db in that mode, in pgx.QueryExecModeExec instead: one
// round trip, nothing kept between round trips, the server inferring the
// parameters' types as describe_exec has it describe them. Inside a
// transaction a pooler keeps one server connection, and nothing changes.
//
// In pgx.QueryExecModeCacheStatement (pgx's default) every statement is a
// named prepared statement, which PgBouncer before 1.21 does not carry
// from one transaction's server connection to the next: statements fail
// with 26000 or 42P05, having run nothing. Explain names the settings
// that fix it.
package pgmode

import (
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Of returns the default query mode of db's connections, and false when db
// does not show it (a type other than *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn or pgx.Tx, or one that wraps them). It copies the
// configuration: call it once per db, not per statement (see Override).
func Of(db any) (pgx.QueryExecMode, bool) {
	switch d := db.(type) {
	case interface{ Config() *pgxpool.Config }:
		return d.Config().ConnConfig.DefaultQueryExecMode, true
	case interface{ Config() *pgx.ConnConfig }:
		return d.Config().DefaultQueryExecMode, true
	case interface{ Conn() *pgx.Conn }:
		return d.Conn().Config().DefaultQueryExecMode, true
	}
	return 0, false
}

// Override is what a statement sent on a db goes with: nil, or the
// argument (pgx.QueryExecModeExec) that Args puts before the statement's
// own, for a db whose mode is describe_exec.
type Override []any

// For returns the Override for statements sent on db outside a
// transaction: for a db in describe_exec mode, exec mode; for any other
// db (and for a pgx.Tx, whose statements share one server connection) none.
func For(db any) Override {
	if _, ok := db.(pgx.Tx); ok {
		return nil
	}
	if m, ok := Of(db); ok && m == pgx.QueryExecModeDescribeExec {
		return Override{pgx.QueryExecModeExec}
	}
	return nil
}

// ForEach is For for a db given per call (not held by a long-lived
// value): it remembers the last *pgxpool.Pool it saw, so that a caller
// that uses one pool pays for reading its configuration once.
func ForEach(db any) Override {
	p, ok := db.(*pgxpool.Pool)
	if !ok {
		if _, tx := db.(pgx.Tx); tx {
			return nil
		}
		return For(db)
	}
	if last := lastPool.Load(); last != nil && last.pool == p {
		return last.over
	}
	o := For(p)
	lastPool.Store(&poolOverride{p, o})
	return o
}

type poolOverride struct {
	pool *pgxpool.Pool
	over Override
}

var lastPool atomic.Pointer[poolOverride]

// Args returns args to send with a statement: args themselves when o is
// nil (no copy), else o's mode followed by args.
func (o Override) Args(args ...any) []any {
	if o == nil {
		return args
	}
	return append(append(make([]any, 0, len(args)+1), o[0]), args...)
}

// Explain returns err with a hint naming the settings to change when err
// says that a prepared statement pgx expected on the connection was
// missing (26000) or already there (42P05): the sign of pgx's
// cache_statement mode behind a transaction pooler that does not keep
// prepared statements (or of a DEALLOCATE or DISCARD ALL on the
// connection). The statement ran nothing. Any other err, and one Explain
// returned already, is returned as is.
func Explain(err error) error {
	var pgErr *pgconn.PgError
	var h *hinted
	if !errors.As(err, &pgErr) || pgErr.Code != "26000" && pgErr.Code != "42P05" || errors.As(err, &h) {
		return err
	}
	return &hinted{err}
}

// hinted is an error Explain has added its hint to.
type hinted struct{ err error }

func (h *hinted) Error() string {
	return h.err.Error() + " (nothing ran: a prepared statement was missing or already there on the server connection; " +
		"behind PgBouncer before 1.21 in transaction pooling set pgx's default_query_exec_mode to exec, cache_describe or simple_protocol; " +
		"from PgBouncer 1.21 set max_prepared_statements)"
}

func (h *hinted) Unwrap() error { return h.err }
