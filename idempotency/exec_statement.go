package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/pgerr"
)

// statement returns sql wrapped in claimedSQL and claimedTakeoverSQL, after refusing it unless
// it uses exactly len(args) parameters: Exec's own follow the caller's, so
// a missing argument would silently bind one of them (a debit "WHERE
// account = $1" matching nothing, stored as refused). The first call with
// a statement text describes it (one round trip, nothing run), one text
// at a time, and the result is kept for the Store's life, for its first
// maxDescribed texts. No statement runs unchecked: one the server cannot
// describe is refused, or its call fails having run nothing (see
// describe).
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
			w, err := s.describe(ctx, sql, args)
			if err != nil {
				return wrapped{}, err
			}
			if v = w; s.describedTexts < s.maxDescribed {
				s.describedTexts++
				s.statements.Store(sql, w)
			}
		}
	}
	if w := v.(wrapped); w.params != n {
		return wrapped{}, idemrecord.Invalid("sql uses %d parameters and %d args were given", w.params, n)
	}
	return v.(wrapped), nil
}

// describe describes sql, called with args, for statement, which holds
// s.describing. The description is
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
func (s *Store) describe(ctx context.Context, sql string, args []any) (wrapped, error) {
	h, err := s.acquire(ctx)
	if err != nil {
		return wrapped{}, err
	}
	defer h.done()
	conn := h.conn
	if h.nested() { // a refused describe must not abort the caller's transaction
		if _, err := conn.Exec(ctx, "savepoint "+savepoint); err != nil {
			return wrapped{}, errfmt.Errorf("idempotency: describe the statement: %w", err)
		}
		h.saved = true
		defer h.rollback(ctx, nil)
	}
	d, err := conn.Prepare(ctx, "", sql)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P18" && !pgerr.Ambiguous(err) {
		oids := make([]uint32, len(args))
		for i, a := range args {
			if t, ok := conn.TypeMap().TypeForValue(a); ok && a != nil {
				oids[i] = t.OID
			}
		}
		if d, err = conn.PgConn().Prepare(ctx, "", sql, oids); errors.As(err, &pgErr) && !pgerr.Ambiguous(err) {
			return wrapped{}, idemrecord.Invalid("Exec cannot check sql's parameters against its %d args: the server cannot tell their types (%v); cast them, as in $1::text", len(args), err)
		}
	}
	if err != nil {
		if !errors.As(err, &pgErr) || pgerr.Ambiguous(err) {
			err = pgerr.MarkUnsent(err)
		}
		return wrapped{}, errfmt.Errorf("idempotency: describe the statement: %w", err)
	}
	n := len(d.ParamOIDs)
	return wrapped{
		text:     fmt.Sprintf(s.claimedSQL, sql, n+1, n+2, n+3, n+4),
		takeover: fmt.Sprintf(s.claimedTakeoverSQL, sql, n+1, n+2, n+3, n+4),
		params:   n,
	}, nil
}

// wrapped is the caller's statement as Exec sends it.
type wrapped struct {
	text     string // in claimedSQL
	takeover string // in claimedTakeoverSQL, replacing an expired record
	params   int    // the caller's statement's parameters
}

// maxDescribed bounds how many statement texts a Store remembers (against
// SQL built afresh for each call, which is then described on every call):
// each Store's maxDescribed, set by New.
const maxDescribed = 4096
