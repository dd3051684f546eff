package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// execFuncSQL is the function through which Exec runs a statement by
// default: one call, one round trip, one implicit transaction, every lock
// wait bounded by lock_timeout (Exec calls it only with a bound).
//
// The call takes the key's advisory lock for the rest of its transaction
// (a hash of scope and key seeded with the table's OID: two keys share
// one only on a 64-bit collision, which costs a wait, nothing else), so
// that concurrent calls with the key queue there; Do's claims take the
// same lock (see keyLock). It sets lock_timeout and tries the lock in
// plain expressions, which PL/pgSQL evaluates without running a query;
// only a lock held by another call costs a query that waits. It then
// reads the key's record with a snapshot taken after that wait. A live
// record is the answer: the statement does not run and the record is
// returned (replayed). On a server with a synchronous standby, the call
// then writes WAL, so that its commit returns once the standby holds the
// record; and it reads the record once before the lock too, so that a
// replay of a record committed before the call does not hold the key
// while it waits for the standby. Without a live record, it deletes an
// expired one (unless it was renewed meanwhile), runs the statement and
// inserts the record of its rows, as execSQL does. A record inserted
// meanwhile without the lock (by WithSharedRoundTrip's Exec, or by a Do
// that does not take it) makes the insert fail with a unique violation,
// and the statement rolls back with it. A call in a session that is not
// Read Committed (the read after the wait needs a snapshot of its own)
// does nothing and returns NULLs: Exec then claims the key instead.
//
// Format verbs: %[1]s the function's name, %[2]s the caller's parameter
// types (each followed by a comma), %[3]s the dollar-quote tag, %[4]s the
// statement; $%[5]d to $%[9]d are Exec's own parameters (lock_timeout,
// scope, key, fingerprint, retention in µs), after the caller's, so that
// the statement's own $1..$n are the function's.
const execFuncSQL = `CREATE FUNCTION %[1]s(%[2]s text, text, text, bytea, bigint,
  OUT nolock_fingerprint bytea, OUT nolock_terminal boolean, OUT nolock_result bytea, OUT nolock_created_at timestamptz,
  OUT nolock_expires_at timestamptz, OUT nolock_replayed boolean, OUT nolock_took_over boolean)
LANGUAGE plpgsql AS %[3]s
#variable_conflict use_column
DECLARE nolock_expired boolean;
  nolock_standby boolean := current_setting('synchronous_standby_names') <> '';
  nolock_lock_timeout text;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RETURN;
  END IF;
  nolock_lock_timeout := set_config('lock_timeout', coalesce($%[5]d, current_setting('lock_timeout')), true);
  FOR nolock_i IN 1..2 LOOP
    IF nolock_i = 2 OR nolock_standby THEN
      SELECT fingerprint, terminal, result, created_at, expires_at, expires_at + interval '0 s' <= now()
        INTO nolock_fingerprint, nolock_terminal, nolock_result, nolock_created_at, nolock_expires_at, nolock_expired
        FROM {{table}} WHERE scope = $%[6]d AND key = $%[7]d;
      nolock_took_over := FOUND;
      IF FOUND AND NOT nolock_expired THEN
        IF nolock_standby THEN
          PERFORM pg_logical_emit_message(true, 'nolock', '');
        END IF;
        nolock_replayed := true;
        RETURN;
      END IF;
    END IF;
    IF nolock_i = 1 AND NOT pg_try_advisory_xact_lock(hashtextextended(length($%[6]d) || ':' || $%[6]d || $%[7]d, {{table_literal}}::regclass::oid::bigint)) THEN
      PERFORM pg_advisory_xact_lock(hashtextextended(length($%[6]d) || ':' || $%[6]d || $%[7]d, {{table_literal}}::regclass::oid::bigint));
    END IF;
  END LOOP;
  IF nolock_took_over THEN
    DELETE FROM {{table}} WHERE scope = $%[6]d AND key = $%[7]d AND expires_at + interval '0 s' <= now();
  END IF;
  nolock_replayed := false;
  WITH nolock_effect AS (%[4]s
  )
  INSERT INTO {{table}} (scope, key, fingerprint, result, terminal, expires_at)
  SELECT $%[6]d, $%[7]d, $%[8]d, convert_to(coalesce(r.rows, '[]'), 'UTF8'), r.rows IS NULL,
         now() + $%[9]d * interval '1 microsecond'
  FROM (SELECT json_agg(e)::text AS rows FROM nolock_effect e) r
  RETURNING fingerprint, terminal, result, created_at, expires_at
  INTO nolock_fingerprint, nolock_terminal, nolock_result, nolock_created_at, nolock_expires_at;
END
%[3]s`

// execFuncVersion changes whenever execFuncSQL does, so that a
// Store never calls a function made from an older text.
const execFuncVersion = "7"

// The states of an execFunc.
const (
	funcUnknown int32 = iota // not made yet, or to be checked again
	funcReady                // the function exists
	funcNone                 // not for this Store: the claim plan runs instead
)

// execFunc is the function of one statement text (see execFuncSQL).
type execFunc struct {
	state atomic.Int32
	mu    sync.Mutex             // held while making the function
	call  atomic.Pointer[string] // the query that calls it, schema-qualified
	oids  []uint32               // the statement's parameter types
	sql   string                 // the statement
	name  string                 // the function's, unqualified
	tag   string                 // its body's dollar-quote tag
}

// maxFuncParams is PostgreSQL's limit on a function's arguments.
const maxFuncParams = 100

func newExecFunc(table, sql string, oids []uint32) *execFunc {
	d := sha256.Sum256([]byte(execFuncVersion + "\x00" + table + "\x00" + fmt.Sprint(oids) + "\x00" + sql))
	return &execFunc{sql: sql, oids: oids, name: "nolock_exec_" + hex.EncodeToString(d[:12]), tag: "$nolock_" + hex.EncodeToString(d[:6]) + "$"}
}

// funcUsable makes g's function if it does not exist yet, and says whether
// this call may use it. It may not while another call is making it (this
// one claims the key instead), and never for the Store when the function
// cannot be made or trusted: the role may not create functions in its
// current schema (or run them), transactions are not Read Committed by
// default, the statement contains the body's dollar-quote tag or has too
// many parameters, a function of that name there is not this one, or the
// server refused the CREATE. A failure that proves nothing (a lost
// connection, a lock wait that ran out) leaves it to a later call.
func (s *Store) funcUsable(ctx context.Context, g *execFunc) bool {
	switch g.state.Load() {
	case funcReady:
		return true
	case funcNone:
		return false
	}
	if !g.mu.TryLock() {
		return false
	}
	defer g.mu.Unlock()
	if st := g.state.Load(); st != funcUnknown {
		return st == funcReady
	}
	st, err := s.makeFunc(ctx, g)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
	case errors.As(err, &pgErr) && !pgerr.Ambiguous(err) && !slices.Contains([]string{"40001", "40P01", "55P03", "57014"}, pgErr.Code):
		st = funcNone // refused for good
	default:
		return false
	}
	g.state.Store(st)
	return st == funcReady
}

// makeFunc makes g's function in the connection's current schema unless
// it is there, in one transaction that holds nolock's lock for it (so
// that processes making the same function at once do not fail each
// other). A function of that name is used only if it is exactly this
// one: the same body, language and arguments, not SECURITY DEFINER and
// with no settings of its own.
func (s *Store) makeFunc(ctx context.Context, g *execFunc) (int32, error) {
	n := len(g.oids)
	if strings.Contains(g.sql, g.tag) || n+5 > maxFuncParams {
		return funcNone, nil
	}
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return funcUnknown, err
	}
	defer c.Release()
	state := funcNone
	err = pgx.BeginFunc(ctx, c.Conn(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', '5000', true), pg_advisory_xact_lock(hashtextextended('nolock exec function ' || $1, 0))`, s.over.Args(g.name)...); err != nil {
			return err
		}
		var types []string
		var schema, isolation string
		var allowed, found bool
		err := tx.QueryRow(ctx, `SELECT coalesce(current_schema(), ''), current_setting('default_transaction_isolation'),
  coalesce(has_schema_privilege(current_schema(), 'CREATE'), false),
  ARRAY(SELECT format_type(o, NULL) FROM unnest($2::oid[]) WITH ORDINALITY AS p(o, i) ORDER BY i),
  EXISTS (SELECT FROM pg_proc WHERE proname = $1 AND pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()))`,
			s.over.Args(g.name, g.oids)...).Scan(&schema, &isolation, &allowed, &types, &found)
		if err != nil || isolation != "read committed" || schema == "" {
			return err
		}
		params := strings.Join(append(types, ""), ", ") // each followed by a comma ("" for none)
		body := fmt.Sprintf(s.execFuncSQL, g.name, params, g.tag, g.sql, n+1, n+2, n+3, n+4, n+5)
		src := body[strings.Index(body, g.tag)+len(g.tag) : strings.LastIndex(body, g.tag)]
		fn := pgx.Identifier{schema, g.name}.Sanitize()
		if !found && allowed {
			if _, err := tx.Exec(ctx, body, s.over.Args()...); err != nil {
				return err
			}
		} else if !found {
			return nil
		}
		var ours bool
		if err := tx.QueryRow(ctx, `SELECT count(*) = 1 AND bool_and(l.lanname = 'plpgsql' AND p.prosrc = $2 AND NOT p.prosecdef
    AND p.proconfig IS NULL AND p.proargtypes::text = array_to_string($3::oid[], ' ') AND has_function_privilege(p.oid, 'EXECUTE'))
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.proname = $1 AND p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())`,
			s.over.Args(g.name, src, append(slices.Clone(g.oids), pgtype.TextOID, pgtype.TextOID, pgtype.TextOID, pgtype.ByteaOID, pgtype.Int8OID))...).Scan(&ours); err != nil || !ours {
			return err
		}
		call := fmt.Sprintf("SELECT * FROM %s(%s)", fn, placeholders(n+5))
		g.call.Store(&call)
		state = funcReady
		return nil
	})
	return state, err
}

// placeholders returns "$1, $2, …, $n".
func placeholders(n int) string {
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("$%d", i+1)
	}
	return strings.Join(p, ", ")
}

// execViaFunc is one attempt of Exec through g's function: one round trip
// that replays a live record or runs the statement and stores its record.
func (s *Store) execViaFunc(ctx context.Context, stmt wrapped, scope, key string, fp []byte, args []any) (Result, error) {
	g := stmt.fn
	wait, sargs := s.args(ctx, scope, key, fp, args)
	f := found{Record: Record{Scope: scope, Key: key}}
	var replayed *bool
	var tookOver bool
	err := s.pg.Row(ctx, s.db, *g.call.Load(), s.over.Args(sargs...)...).Scan(&f.Fingerprint, &f.Terminal, &f.Body, &f.CreatedAt, &f.ExpiresAt, &replayed, &tookOver)
	var pgErr *pgconn.PgError
	switch {
	case err == nil && replayed == nil:
		// Not Read Committed in this session: nothing was run; claim.
		return s.once(ctx, &s.execPlan, scope, key, fp, runClaimed(stmt, args))
	case err == nil && *replayed:
		s.execPlan.observe(true)
		return replayOf(f.Record, fp)
	case err == nil:
		s.execPlan.observe(false)
		if tookOver {
			s.obs.Notify(ctx, observe.Event{Name: EventExpired, Key: key})
		}
		return Result{Record: f.Record}, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42883" && pgErr.Where == "" && strings.Contains(pgErr.Message, g.name):
		g.state.CompareAndSwap(funcReady, funcUnknown) // dropped since, or lost in a failover: made again
		return Result{}, errfmt.Errorf("%w: %w", errVanished, err)
	}
	return s.execFailed(ctx, scope, key, fp, wait, err)
}
