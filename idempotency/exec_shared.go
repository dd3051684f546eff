package idempotency

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// readAndRun sends gateSQL and stmt in one pipeline, one implicit
// transaction, and returns the key's record if there is one (the server
// then skipped stmt), or else stmt's outcome, its record scanned into rec.
// sent is false when the connection could not be had or a statement not
// prepared: then neither was run.
//
// Both are named prepared statements of the connection (prepared on its
// first use, two more round trips) rather than entries of pgx's statement
// cache, which drops every statement of a batch that failed: the gate's
// error is how a replay ends. When the server no longer has one (after
// DISCARD ALL or DEALLOCATE ALL, which leave pgx's list stale, or a change
// to the table's columns), both names are dropped and the attempt is made
// again.
func (s *Store) readAndRun(ctx context.Context, scope, key string, stmt wrapped, args []any, rec *Record) (stored *found, sent bool, err error) {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, false, errfmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
	}
	conn := c.Conn()
	for _, q := range [][2]string{{s.gateName, s.gateSQL}, {stmt.name, stmt.text}} {
		if _, err := conn.Prepare(ctx, q[0], q[1]); err != nil {
			c.Release()
			if s.pg.Learn(conn, err) { // the next attempt reads first, unnamed
				return nil, false, errfmt.Errorf("%w: %w", errVanished, err)
			}
			return nil, false, errfmt.Errorf("idempotency: exec %q: prepare: %w", key, pgmode.Explain(err))
		}
	}
	b := &pgx.Batch{}
	b.Queue(s.gateName, scope, key)
	b.Queue(stmt.name, args...)
	// The statement commits on its own: it runs to its end on the
	// server's terms even if the caller stops waiting (see pgerr.Committer.Commit),
	// and the connection is released by whoever finishes it.
	var gs *found
	err = s.pg.Commit(ctx, func(ctx context.Context) error {
		defer c.Release()
		var err error
		gs, err = s.gateAndRun(ctx, conn, b, scope, key, stmt.name, rec)
		return err
	})
	if errors.Is(err, pgerr.ErrStoppedWaiting) {
		return nil, true, err // the pipeline still runs: leave its results
	}
	return gs, true, err
}

// gateAndRun sends readAndRun's pipeline on conn and reads its results.
func (s *Store) gateAndRun(ctx context.Context, conn *pgx.Conn, b *pgx.Batch, scope, key, name string, rec *Record) (stored *found, err error) {
	br := conn.SendBatch(ctx, b)
	rows, _ := br.Query()
	for rows.Next() {
		f := found{Record: Record{Scope: scope, Key: key}}
		if err = f.scan(rows); err != nil {
			break
		}
		stored = &f
	}
	switch {
	case stored != nil:
		br.Close() // the gate's error: it skipped stmt
		return stored, nil
	case err == nil && rows.Err() != nil:
		err = rows.Err()
	case err == nil:
		err = br.QueryRow().Scan(&rec.CreatedAt, &rec.ExpiresAt, &rec.Body, &rec.Terminal)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return nil, s.unprepared(ctx, conn, name, err)
}

// unprepared returns err, or errVanished (make the attempt again) when
// err says that one of readAndRun's prepared statements is gone (26000:
// the endpoint is then learnt not to keep named statements, and the next
// attempt reads first, unnamed; see pgmode.Modes.Learn) or no longer fits the
// table (0A000 from the server's revalidation of it, "cached plan must not
// change result type", which recurs until it is prepared again: both
// names are dropped).
func (s *Store) unprepared(ctx context.Context, conn *pgx.Conn, name string, err error) error {
	if s.pg.Learn(conn, err) {
		return errfmt.Errorf("%w: %w", errVanished, err)
	}
	var pgErr *pgconn.PgError
	if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "0A000" || pgErr.Routine != "RevalidateCachedQuery" {
		return err
	}
	for _, q := range []string{s.gateName, name} {
		if derr := conn.Deallocate(ctx, q); derr != nil {
			return err
		}
	}
	return errfmt.Errorf("%w: %w", errVanished, err)
}

// plan chooses between two ways of sending a call, from the calls the
// Store has seen: optimistic, as if the key were new, or reading the key's
// record first. For Do and Exec, optimistic claims the key in the
// transaction's first round trip: a replay costs that transaction's two
// round trips instead of one read. For Exec with WithSharedRoundTrip,
// optimistic shares one round trip between the read and the statement: a
// first run costs one round trip instead of two, and a replay the read
// plus a skipped statement (an aborted transaction, as much again as the
// read on a busy server). Reading first costs a
// replay the read alone, and a first run one round trip more. A plan reads
// first once the calls that found a record outnumber those that did not,
// and is optimistic again once the others have made up the difference (the
// count stops at ±planMemory, so a long past weighs no more than
// planMemory calls). The outcomes are the same either way; only the cost
// differs.
type plan struct {
	lean atomic.Int32 // +1 per call that found a record, -1 per call that did not, within ±planMemory
}

const planMemory = 64

func (p *plan) readFirst() bool { return p.lean.Load() > 0 }

func (p *plan) observe(found bool) {
	for {
		old := p.lean.Load()
		v := old - 1
		if found {
			v = old + 1
		}
		if v < -planMemory || v > planMemory || p.lean.CompareAndSwap(old, v) {
			return
		}
	}
}
