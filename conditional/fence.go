package conditional

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// Fenced writes rows of your own table only for a holder whose fencing
// token is at least the one the row carries, and stores the token with the
// write: "UPDATE t SET ..., fence = $token WHERE key = $k AND fence <=
// $token". A holder that paused past the end of its lease (a GC pause, a
// stopped VM) and wakes up to write after a newer holder has written is
// refused with ErrFenced; the row decides, not the holder's belief.
//
// Tokens come from any source that only grows per resource: a lock
// service's fencing token (dynamolock), a partition epoch or generation, a
// database sequence. Each holder needs its own token, since equal tokens
// pass (one holder writes many times). A row whose fence is NULL has never
// been fenced and accepts any token.
//
// Guarantee: on one row, the writes that apply carry non-decreasing
// tokens, in commit order. Fenced does not issue or check tokens (a token
// above any issued passes, and then fences out everyone below it), does
// not fence effects outside the row, and does not create rows.
//
// A Fenced is safe for concurrent use, and works on any DB given per call:
// a pool, a *pgx.Conn or a caller's pgx.Tx (see DB). An Update on a pool
// whose caller stopped waiting (its ctx ended) runs on to its end, at most
// pgoutcome.CommitTimeout; Close waits for those. On a *pgx.Conn the
// Update waits for its end instead.
type Fenced struct {
	table, key, fence string // quoted
	keyCol, fenceCol  string // as given, to check set's columns
	obs               observe.Observer
	pg                *pgerr.Committer // its writes; Close waits for their commits
}

// NewFenced returns a Fenced for table, whose rows are found by keyColumn
// (a primary key or unique column: one key must name at most one row) and
// carry their token in fenceColumn (an integer column, best NOT NULL
// DEFAULT 0). The names are quoted, never interpolated raw; table is one
// identifier, found through the search_path. Its one option is
// WithObserver (see Option).
func NewFenced(table, keyColumn, fenceColumn string, opts ...Option) (*Fenced, error) {
	var cfg config
	if err := apply(&cfg, opts, "NewFenced", fencedSetters); err != nil {
		return nil, err
	}
	for _, a := range []struct{ arg, name string }{{"table", table}, {"key column", keyColumn}, {"fence column", fenceColumn}} {
		if err := validIdent(a.arg, a.name); err != nil {
			return nil, err
		}
	}
	if keyColumn == fenceColumn {
		return nil, condcore.Invalid("key column and fence column are both %q", keyColumn)
	}
	return &Fenced{
		table: pgx.Identifier{table}.Sanitize(), key: pgx.Identifier{keyColumn}.Sanitize(),
		fence: pgx.Identifier{fenceColumn}.Sanitize(), keyCol: keyColumn, fenceCol: fenceColumn, obs: cfg.obs,
		pg: new(pgerr.Committer),
	}, nil
}

// Update writes set (column name → value) to the row whose key column
// equals key, and token to its fence column, if the row's fence is at most
// token. It returns ErrFenced when the row carries a higher token, and
// ErrNotFound when no row had the key as the statement began; then
// nothing was written. With an empty set it only advances the fence, which
// fences out older holders before the new one's first write.
//
// Update is one statement (its text is the same for the same columns, so
// prepared-statement caches work). On a pgx.Tx it commits or rolls back
// with the caller's transaction, and the row stays locked until then: a
// concurrent writer waits, and is then judged against the committed token.
// A row deleted while the statement waited for it reports ErrFenced.
// ErrAmbiguousCommit means the connection failed after the statement was
// sent outside a transaction: a retry with the same token is safe if the
// values are the same.
//
// Values go as parameters, typed by their columns. Bad input (token < 0,
// nil key, empty or overlong column names, a set naming the key or fence
// column) is ErrInvalid, before any I/O.
func (f *Fenced) Update(ctx context.Context, db DB, key any, token int64, set map[string]any) error {
	var e observe.Event
	if f.obs != nil {
		e = observe.Event{Key: fmt.Sprint(key), Token: token}
	}
	return condcore.ObservedErr(ctx, f.obs, condcore.Fence, true, e, func(ctx context.Context) error { return f.update(ctx, db, key, token, set) })
}

func (f *Fenced) update(ctx context.Context, db DB, key any, token int64, set map[string]any) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	switch {
	case pgarg.NilDB(db):
		return condcore.Invalid("db is nil")
	case key == nil:
		return condcore.Invalid("key is nil")
	case token < 0:
		return condcore.Invalid("token %d is negative", token)
	}
	cols := slices.Sorted(maps.Keys(set))
	for _, c := range cols {
		if err := validIdent("set column", c); err != nil {
			return err
		}
		switch c {
		case f.keyCol:
			return condcore.Invalid("set names the key column %q", c)
		case f.fenceCol:
			return condcore.Invalid("set names the fence column %q; the token is written there", c)
		}
	}

	if err := condcore.Unsent(ctx, "fenced update"); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("WITH u AS (UPDATE " + f.table + " SET " + f.fence + " = $1")
	args := make([]any, 2, 2+len(cols))
	args[0], args[1] = token, key
	for _, c := range cols {
		args = append(args, set[c])
		b.WriteString(", " + pgx.Identifier{c}.Sanitize() + " = $" + strconv.Itoa(len(args)))
	}
	b.WriteString(" WHERE " + f.key + " = $2 AND (" + f.fence + " IS NULL OR " + f.fence + " <= $1) RETURNING 1)\n")
	b.WriteString("SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM " + f.table + " WHERE " + f.key + " = $2)")

	var done, exists bool
	if err := committerOn(f.pg, db).Row(ctx, db, b.String(), f.pg.ForEach(db).Args(args...)...).Scan(&done, &exists); err != nil {
		return errfmt.Errorf("conditional: fenced update: %w", classifyOn(db, err))
	}
	switch {
	case done:
		return nil
	case !exists:
		return errfmt.Errorf("conditional: fenced update: %w", ErrNotFound)
	default:
		return errfmt.Errorf("conditional: fenced update with token %d: %w", token, ErrFenced)
	}
}

// validIdent checks an SQL identifier argument before it is quoted (see
// pgarg.Ident).
func validIdent(arg, name string) error {
	if err := pgarg.Ident(arg, name, 0); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Close waits for the Updates' commits in flight whose callers stopped
// waiting (each bounded by pgoutcome.CommitTimeout). It is idempotent and
// safe to call concurrently. An Update after Close still works, its caller
// waiting for its commit whatever ctx does.
func (f *Fenced) Close() error {
	f.pg.Close()
	return nil
}
