package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/pgerr"
)

// statement returns sql wrapped, after refusing it unless it
// uses exactly len(args) parameters: Exec's own follow the caller's, so a
// missing argument would silently bind one of them (a debit "WHERE
// account = $1" matching nothing, stored as refused). The first call with
// a statement text describes it (a few round trips, nothing run), one text
// at a time, and the result is kept for the Store's life, for its first
// maxDescribed texts. No statement runs unchecked: one the server cannot
// describe is refused, or its call fails having run nothing (see
// describe).
//
// It also decides whether the statement may share a round trip with the
// read (see readAndRun): only through a pool that prepares statements
// anyway, as every connection keeps one for it; only for the first
// maxShared texts the Store meets; and only where transactions are Read
// Committed by default (as the Store's first connection says), since
// under Serializable the read's predicate locks, in the statement's
// transaction, would fail concurrent first runs of neighbouring keys
// (40001).
func (s *Store) statement(ctx context.Context, sql string, args []any) (wrapped, error) {
	n := len(args)
	v, ok := s.statements.Load(sql)
	if !ok {
		select {
		case s.describing <- struct{}{}:
			defer func() { <-s.describing }()
		case <-ctx.Done():
			return wrapped{}, errfmt.Errorf("idempotency: describe the statement: %w", context.Cause(ctx))
		}
		if v, ok = s.statements.Load(sql); !ok {
			w, keep, err := s.describe(ctx, sql, args)
			if err != nil {
				return wrapped{}, err
			}
			if v = w; keep && s.describedTexts < maxDescribed {
				s.describedTexts++
				if !s.shared && w.typed && s.funcTexts < maxShared {
					s.funcTexts++
					w.fn = newExecFunc(s.table, sql, w.oids)
					v = w
				}
				s.statements.Store(sql, w)
			}
		}
	}
	w := v.(wrapped)
	switch {
	case w.params != n:
		return wrapped{}, idemrecord.Invalid("sql uses %d parameters and %d args were given", w.params, n)
	}
	return w, nil
}

// describe describes sql, called with args, for statement, which holds
// s.describing, and says whether to keep the outcome. The description is
// the unnamed statement's, made and read in one round trip, so a
// transaction pooler cannot split it.
//
// Where the server cannot infer a parameter's type from sql alone
// (42P18: only the wrapper, or the value sent through a simple-protocol
// pool, implies it), sql is described again with the types pgx gives
// args' Go values: the number of parameters does not depend on them, but
// is then at least len(args), so a missing argument is caught (it would
// bind one of Exec's own parameters) and one too many is left to the
// statement's run, which refuses an argument no parameter takes. If the
// server still cannot describe it, the call is refused (ErrInvalid)
// before anything runs: a cast ($1::text) makes it describable.
//
// Any other refusal (a table not created yet, a syntax error) fails the
// call with the server's error, having run nothing, and so does a
// describe without the server's answer (a connection lost); sql is
// described again on the next call.
func (s *Store) describe(ctx context.Context, sql string, args []any) (w wrapped, keep bool, err error) {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return wrapped{}, false, errfmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
	}
	defer c.Release()
	conn := c.Conn()
	d, err := conn.Prepare(ctx, "", sql)
	var pgErr *pgconn.PgError
	typed := true // the server told every parameter's type
	if errors.As(err, &pgErr) && pgErr.Code == "42P18" && !pgerr.Ambiguous(err) {
		typed = false
		oids := make([]uint32, len(args))
		for i, a := range args {
			if t, ok := conn.TypeMap().TypeForValue(a); ok && a != nil {
				oids[i] = t.OID
			}
		}
		if d, err = conn.PgConn().Prepare(ctx, "", sql, oids); errors.As(err, &pgErr) && !pgerr.Ambiguous(err) {
			return wrapped{}, false, idemrecord.Invalid("Exec cannot check sql's parameters against its %d args: the server cannot tell their types (%v); cast them, as in $1::text", len(args), err)
		}
	}
	if err != nil {
		if !errors.As(err, &pgErr) || pgerr.Ambiguous(err) {
			err = pgerr.MarkUnsent(err)
		}
		return wrapped{}, false, errfmt.Errorf("idempotency: describe the statement: %w", err)
	}
	n := len(d.ParamOIDs)
	w = s.wrap(sql, n, s.shared)
	w.oids, w.typed = d.ParamOIDs, typed
	if !s.shared {
		return w, true, nil
	}
	if s.isolation == "" {
		_ = conn.QueryRow(ctx, `SELECT current_setting('default_transaction_isolation')`, s.over.Args()...).Scan(&s.isolation)
	}
	if s.sharedTexts < maxShared && s.isolation == "read committed" &&
		conn.Config().DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && !s.pg.Unnamed(conn) {
		s.sharedTexts++
		w.name = preparedName(w.text)
	}
	return w, true, nil
}

// wrapped is the caller's statement as Exec sends it.
type wrapped struct {
	text   string    // in claimedSQL, or with WithSharedRoundTrip in execSQL
	params int       // the caller's statement's parameters
	name   string    // its prepared statement's, when it may share the read's round trip
	oids   []uint32  // its parameters' types
	typed  bool      // as the server inferred them from the statement alone
	fn     *execFunc // its function (see execFuncSQL), for the first maxShared typed texts without WithSharedRoundTrip
}

// maxShared bounds how many statement texts a Store prepares on each
// connection (or, without WithSharedRoundTrip, makes functions for), and
// maxDescribed how many it remembers (against SQL built
// afresh for each call, which is then described on every call). The
// bounds are per Store.
const maxShared, maxDescribed = 64, 4096

// wrap returns sql, which uses n parameters, wrapped in execSQL (shared)
// or claimedSQL.
func (s *Store) wrap(sql string, n int, shared bool) wrapped {
	if shared {
		return wrapped{text: fmt.Sprintf(s.execSQL, sql, n+1, n+2, n+3, n+4, n+5), params: n}
	}
	return wrapped{text: fmt.Sprintf(s.claimedSQL, sql, n+1, n+2, n+3), params: n}
}

// preparedName names readAndRun's prepared statement for sql. Not sql
// itself: pgx would then run sql through it everywhere on the connection,
// where nothing prepares it again after a DEALLOCATE ALL.
func preparedName(sql string) string {
	d := sha256.Sum256([]byte(sql))
	return "nolock_" + hex.EncodeToString(d[:20])
}
