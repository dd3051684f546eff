package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/observe"
)

// gateFnSQL is the function through which Exec runs a statement by
// default: one call, one round trip, one implicit transaction, every lock
// wait bounded by lock_timeout.
//
// The call takes the key's advisory lock (in the table's own lock space:
// its OID seeds the hash) for the rest of its transaction, so that
// concurrent calls with the key queue there, then reads the key's record
// with a snapshot taken after that wait. A live record is the answer: the
// statement does not run and the record is returned (replayed). On a
// server with a synchronous standby, the call then writes WAL, so that its
// commit returns once the standby holds the record; and it reads the
// record once before the lock too, so that a replay never holds the key
// while it waits for the standby. Only then does it delete
// an expired record (unless a takeover through Do renewed it meanwhile),
// run the statement and insert the record of its rows, as execSQL does. A
// record inserted meanwhile through Do, which claims keys by inserting and
// not by this lock, makes the insert fail with a unique violation, and the
// statement rolls back with it.
//
// Format verbs: %[1]s the function's name, %[2]s the caller's parameter
// types (each followed by a comma), %[3]s the dollar-quote tag, %[4]s the
// statement; $%[5]d to $%[9]d are Exec's own parameters (lock_timeout,
// scope, key, fingerprint, retention in µs), after the caller's, so that
// the statement's own $1..$n are the function's.
const gateFnSQL = `CREATE FUNCTION %[1]s(%[2]s text, text, text, bytea, bigint,
  OUT nolock_fingerprint bytea, OUT nolock_terminal boolean, OUT nolock_result bytea, OUT nolock_created_at timestamptz,
  OUT nolock_expires_at timestamptz, OUT nolock_replayed boolean, OUT nolock_took_over boolean)
LANGUAGE plpgsql AS %[3]s
#variable_conflict use_column
DECLARE nolock_expired boolean;
  nolock_standby boolean := current_setting('synchronous_standby_names') <> '';
BEGIN
  PERFORM set_config('lock_timeout', coalesce($%[5]d, current_setting('lock_timeout')), true);
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
    IF nolock_i = 1 THEN
      PERFORM pg_advisory_xact_lock(hashtextextended($%[6]d || E'\n' || $%[7]d, {{table_literal}}::regclass::oid::bigint));
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

// gateVersion changes whenever gateFnSQL does, so that a
// Store never calls a function made from an older text.
const gateVersion = "5"

// The states of a gate.
const (
	gateUnknown int32 = iota // not made yet, or to be checked again
	gateReady                // the function exists
	gateNone                 // not for this Store: the claim plan runs instead
)

// gate is the function of one statement text (see gateFnSQL).
type gate struct {
	state atomic.Int32
	mu    sync.Mutex // held while making the function
	oids  []uint32   // the statement's parameter types
	sql   string     // the statement
	name  string     // the function's
	call  string     // the query that calls it
}

func newGate(sql string, oids []uint32) *gate {
	return &gate{sql: sql, oids: oids}
}

// ready makes g's function if it does not exist yet, and says whether
// Exec may call it. It does not when the Store's calls cannot use it: the
// connection may not create functions in its current schema, or
// transactions are not Read Committed by default (the read after the
// key's wait needs a snapshot of its own), or the statement contains the
// function's dollar-quote tag. Those are final for the Store; a failure to
// make it (a lost connection) only sends this call through the claim plan.
func (s *Store) ready(ctx context.Context, g *gate) bool {
	switch g.state.Load() {
	case gateReady:
		return true
	case gateNone:
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.state.Load(); st != gateUnknown {
		return st == gateReady
	}
	st, err := s.makeGate(ctx, g)
	if err != nil {
		return false
	}
	g.state.Store(st)
	return st == gateReady
}

// makeGate creates g's function unless it exists, in one transaction that
// holds nolock's lock for it, so that processes making the same function
// at once do not fail each other.
func (s *Store) makeGate(ctx context.Context, g *gate) (int32, error) {
	d := sha256.Sum256([]byte(gateVersion + "\x00" + s.table + "\x00" + fmt.Sprint(g.oids) + "\x00" + g.sql))
	tag := "$nolock_" + hex.EncodeToString(d[:6]) + "$"
	if strings.Contains(g.sql, tag) {
		return gateNone, nil
	}
	name := "nolock_exec_" + hex.EncodeToString(d[:12])
	n := len(g.oids)
	state := gateNone
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return gateUnknown, err
	}
	defer c.Release()
	err = pgx.BeginFunc(ctx, c.Conn(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('nolock gate ' || $1, 0))`, s.over.Args(name)...); err != nil {
			return err
		}
		var types []string
		var exists, allowed bool
		var isolation string
		err := tx.QueryRow(ctx, `SELECT to_regproc($1) IS NOT NULL, coalesce(has_schema_privilege(current_schema(), 'CREATE'), false),
  current_setting('default_transaction_isolation'),
  ARRAY(SELECT format_type(o, NULL) FROM unnest($2::oid[]) WITH ORDINALITY AS p(o, i) ORDER BY i)`,
			s.over.Args(name, g.oids)...).Scan(&exists, &allowed, &isolation, &types)
		switch {
		case err != nil:
			return err
		case isolation != "read committed" || !exists && !allowed:
			return nil
		case !exists:
			var params strings.Builder
			for _, t := range types {
				params.WriteString(t + ", ")
			}
			create := fmt.Sprintf(s.gateFnSQL, name, params.String(), tag, g.sql, n+1, n+2, n+3, n+4, n+5)
			if _, err := tx.Exec(ctx, create, s.over.Args()...); err != nil {
				return err
			}
		}
		g.name = name
		g.call = fmt.Sprintf("SELECT * FROM %s(%s)", name, placeholders(n+5))
		state = gateReady
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

// execGate is one attempt of Exec through g's function: one round trip
// that replays a live record or runs the statement and stores its record.
func (s *Store) execGate(ctx context.Context, g *gate, scope, key string, fp []byte, args []any) (Result, error) {
	wait, sargs := s.args(ctx, scope, key, fp, args)
	f := found{Record: Record{Scope: scope, Key: key}}
	var replayed, tookOver bool
	err := pgerr.Row(ctx, s.db, g.call, s.over.Args(sargs...)...).Scan(&f.Fingerprint, &f.Terminal, &f.Body, &f.CreatedAt, &f.ExpiresAt, &replayed, &tookOver)
	var pgErr *pgconn.PgError
	switch {
	case err == nil && replayed:
		s.execPlan.observe(true)
		return idemrecord.ReplayOf(f.Record, fp)
	case err == nil:
		s.execPlan.observe(false)
		if tookOver {
			s.obs.Notify(ctx, observe.Event{Name: "idempotency.expired", Key: key})
		}
		return Result{Record: f.Record}, nil
	case errors.As(err, &pgErr) && pgErr.Code == "42883" && pgErr.Where == "" && strings.Contains(pgErr.Message, g.name):
		g.state.CompareAndSwap(gateReady, gateUnknown) // dropped since, or lost in a failover: made again
		return Result{}, fmt.Errorf("%w: %w", errVanished, err)
	}
	return s.execFailed(ctx, scope, key, fp, wait, err)
}
