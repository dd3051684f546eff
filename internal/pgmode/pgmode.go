// Package pgmode makes nolock's own statements safe in every pgx query
// mode, through a transaction pooler (PgBouncer in transaction pooling)
// too.
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
// from one transaction's server connection to the next: a statement fails
// with 26000 or 42P05, having run nothing. The first such failure on a
// server endpoint (host, port, database, user, session parameters) is
// learnt (Modes.Learn) by the owner that sent it (a Store, a Client: each
// keeps its own Modes, nothing is shared across the process): from then
// on that owner sends its statements to that endpoint in
// pgx.QueryExecModeCacheDescribe (unnamed statements, their descriptions
// cached by pgx), inside transactions too, and a one-statement write that
// failed so is sent again at once (see internal/pgerr). Explain names the
// settings that avoid the first failure.
package pgmode

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	if c := config(db); c != nil {
		return c.DefaultQueryExecMode, true
	}
	return 0, false
}

// config returns a copy of the configuration of db's connections, or nil.
func config(db any) *pgx.ConnConfig {
	switch d := db.(type) {
	case interface{ Config() *pgxpool.Config }:
		return d.Config().ConnConfig
	case interface{ Config() *pgx.ConnConfig }:
		return d.Config()
	case interface{ Conn() *pgx.Conn }:
		return d.Conn().Config()
	}
	return nil
}

// Modes is what one owner (a Store, a Client) has learnt about the server
// endpoints its statements go to: which of them drop named prepared
// statements. Each owner makes its own, so two owners share nothing, and
// it stays small: past maxEndpoints distinct endpoints, every further one
// shares one entry (learning that one drops named statements sends all of
// them unnamed: slower by a describe per new statement, never wrong). The
// zero Modes is ready to use; it is safe for concurrent use and must not
// be copied after first use.
type Modes struct {
	mu         sync.Mutex
	endpoints  map[string]*endpoint // at most maxEndpoints
	rest       *endpoint            // every endpoint past maxEndpoints
	anyUnnamed atomic.Bool          // some endpoint is unnamed
	last       atomic.Pointer[poolOverride]
}

// maxEndpoints bounds the endpoints a Modes tells apart. An owner sends to
// one db, so one endpoint (a few for dbs given per call) is the rule.
const maxEndpoints = 16

// For returns the Override for statements sent on db: for a db in
// describe_exec mode outside a transaction, exec mode; for a db in
// cache_statement mode, cache_describe once its endpoint is known (to m)
// to drop named statements; else none. It reads db's configuration once.
func (m *Modes) For(db any) Override {
	c := config(db)
	if c == nil {
		return Override{}
	}
	switch c.DefaultQueryExecMode {
	case pgx.QueryExecModeDescribeExec:
		if _, tx := db.(pgx.Tx); !tx {
			return Override{exec: true}
		}
	case pgx.QueryExecModeCacheStatement:
		return Override{at: m.endpointOf(c)}
	}
	return Override{}
}

// ForEach is For for a db given per call (not held by a long-lived
// value): it remembers the last *pgxpool.Pool it saw, so that a caller
// that uses one pool pays for reading its configuration once, and for a
// transaction it reads the configuration only once m has learnt of some
// endpoint that drops named statements.
func (m *Modes) ForEach(db any) Override {
	switch d := db.(type) {
	case *pgxpool.Pool:
		if last := m.last.Load(); last != nil && last.pool == d {
			return last.over
		}
		o := m.For(d)
		m.last.Store(&poolOverride{d, o})
		return o
	case pgx.Tx:
		if !m.anyUnnamed.Load() {
			return Override{}
		}
	}
	return m.For(db)
}

type poolOverride struct {
	pool *pgxpool.Pool
	over Override
}

// Override is what a statement sent on a db goes with (see Args). The
// zero Override adds nothing.
type Override struct {
	exec bool      // a describe_exec db outside a transaction: exec mode
	at   *endpoint // a cache_statement db's endpoint: cache_describe once learnt
}

// Args returns args to send with a statement: args themselves when o adds
// nothing (no copy), else o's mode followed by args. A mode already first
// in args wins over o's, as pgx reads the last one.
func (o Override) Args(args ...any) []any {
	var mode pgx.QueryExecMode
	switch {
	case o.exec:
		mode = pgx.QueryExecModeExec
	case o.at != nil && o.at.unnamed.Load():
		mode = pgx.QueryExecModeCacheDescribe
	default:
		return args
	}
	return append(append(make([]any, 0, len(args)+1), mode), args...)
}

// endpoint is one server endpoint that cache_statement dbs send to.
type endpoint struct {
	unnamed atomic.Bool // named prepared statements are not kept there
	m       *Modes
}

// learn records that the endpoint does not keep named statements.
func (e *endpoint) learn() {
	e.unnamed.Store(true)
	e.m.anyUnnamed.Store(true)
}

// endpointOf returns c's endpoint, the same for every configuration that
// reaches the same host, port, database and user with the same session
// parameters.
func (m *Modes) endpointOf(c *pgx.ConnConfig) *endpoint {
	var b strings.Builder
	for _, s := range []string{c.Host, strconv.Itoa(int(c.Port)), c.Database, c.User} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, k := range slices.Sorted(maps.Keys(c.RuntimeParams)) {
		b.WriteString(k + "=" + c.RuntimeParams[k])
		b.WriteByte(0)
	}
	key := b.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.endpoints[key]; ok {
		return e
	}
	if len(m.endpoints) >= maxEndpoints {
		if m.rest == nil {
			m.rest = &endpoint{m: m}
		}
		return m.rest
	}
	if m.endpoints == nil {
		m.endpoints = make(map[string]*endpoint)
	}
	e := &endpoint{m: m}
	m.endpoints[key] = e
	return e
}

// MissingNamed reports whether err says that a prepared statement pgx
// expected on the connection was missing (26000) or already there (42P05).
// Such a statement ran nothing.
func MissingNamed(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")
}

// Learn records in m, when err is a missing or duplicate prepared
// statement on a db in cache_statement mode, that db's endpoint does not
// keep named statements, and reports whether it did: the statement ran
// nothing and may be sent again with m.For(db)'s or m.ForEach(db)'s Args.
func (m *Modes) Learn(db any, err error) bool {
	if err == nil || !MissingNamed(err) {
		return false
	}
	c := config(db)
	if c == nil || c.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return false
	}
	m.endpointOf(c).learn()
	return true
}

// Unnamed reports whether db is in cache_statement mode on an endpoint m
// has learnt to drop named statements: statements that cannot carry a
// mode of their own (a pgx.Batch takes its connection's) must not be sent
// as named statements there.
func (m *Modes) Unnamed(db any) bool {
	if !m.anyUnnamed.Load() {
		return false
	}
	c := config(db)
	return c != nil && c.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && m.endpointOf(c).unnamed.Load()
}

// Explain returns err with a hint naming the settings to change when err
// says that a prepared statement pgx expected on the connection was
// missing (26000) or already there (42P05): the sign of pgx's
// cache_statement mode behind a transaction pooler that does not keep
// prepared statements (or of a DEALLOCATE or DISCARD ALL on the
// connection). The statement ran nothing. Any other err, and one Explain
// returned already, is returned as is.
func Explain(err error) error {
	var h *hinted
	if !MissingNamed(err) || errors.As(err, &h) {
		return err
	}
	return &hinted{err}
}

// hinted is an error Explain has added its hint to.
type hinted struct{ err error }

func (h *hinted) Error() string {
	return h.err.Error() + " (nothing ran: a prepared statement was missing or already there on the server connection; " +
		"nolock sends its own statements there unnamed from now on; behind PgBouncer before 1.21 in transaction pooling " +
		"set pgx's default_query_exec_mode to exec, cache_describe or simple_protocol for yours; " +
		"from PgBouncer 1.21 set max_prepared_statements)"
}

func (h *hinted) Unwrap() error { return h.err }

// Querier sends statements: a pool, a connection or a transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Exec is db.Exec(ctx, sql, o.Args(args...)...); outside a transaction, a
// statement that failed because the server connection did not keep pgx's
// named prepared statement ran nothing, and is sent once more, unnamed
// (see Learn). Statements that commit must run under internal/pgerr
// instead, which does the same.
func (o Override) Exec(ctx context.Context, db Querier, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := db.Exec(ctx, sql, o.Args(args...)...)
	if o.again(db, err) {
		tag, err = db.Exec(ctx, sql, o.Args(args...)...)
	}
	return tag, err
}

// QueryRow is db.QueryRow(ctx, sql, o.Args(args...)...), whose Scan sends
// the statement once more as Exec does.
func (o Override) QueryRow(ctx context.Context, db Querier, sql string, args ...any) pgx.Row {
	return retryRow{o, ctx, db, sql, args}
}

type retryRow struct {
	o    Override
	ctx  context.Context
	db   Querier
	sql  string
	args []any
}

func (r retryRow) Scan(dest ...any) error {
	err := r.db.QueryRow(r.ctx, r.sql, r.o.Args(r.args...)...).Scan(dest...)
	if r.o.again(r.db, err) {
		err = r.db.QueryRow(r.ctx, r.sql, r.o.Args(r.args...)...).Scan(dest...)
	}
	return err
}

// again learns from err that o's endpoint drops named statements, and
// reports whether the statement may be sent again (then unnamed, by o's
// Args): it ran nothing, db is not a transaction (which the failure
// aborted), and o sends to a cache_statement endpoint.
func (o Override) again(db any, err error) bool {
	if _, tx := db.(pgx.Tx); tx || o.at == nil || !MissingNamed(err) {
		return false
	}
	o.at.learn()
	return true
}
