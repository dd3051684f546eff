package idempotency

import (
	"context"
	"errors"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgerr"
)

// via says how a Store reaches its database, from the DB given to New.
type via int

const (
	viaPool via = iota // a pool (it has Acquire): a connection per attempt
	viaConn            // a *pgx.Conn: one call at a time on it
	viaTx              // a pgx.Tx: each attempt in a savepoint of it; nothing commits
)

// acquirer is a pool, or a wrapper of one that keeps its Acquire.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// viaOf says how a Store reaches db, or refuses a db it cannot use.
func viaOf(db DB) (via, error) {
	switch db.(type) {
	case acquirer:
		return viaPool, nil
	case *pgx.Conn:
		return viaConn, nil
	case pgx.Tx:
		return viaTx, nil
	}
	return 0, errfmt.Errorf("%w: db is a %T: pass a *pgxpool.Pool (or a type with its Acquire method), a *pgx.Conn or a pgx.Tx", ErrInvalid, db)
}

// savepoint names the savepoint an attempt runs in, inside the caller's
// transaction (viaTx). Not pgx's own names (sp_1, …), which fn's nested
// transactions use.
const savepoint = "nolock_idempotency"

// handle is the connection one attempt of Do or Exec runs on, and how its
// transaction ends: with COMMIT on a connection of its own, or, inside the
// caller's transaction, by releasing its savepoint.
type handle struct {
	conn *pgx.Conn
	// outer is the caller's transaction (viaTx), fn's transaction too;
	// nil otherwise.
	outer pgx.Tx
	// release gives the connection back (to the pool, or to the Store's
	// next call); nil once a commit in flight has taken it over (see
	// detached).
	release func()
	// saved is set while the attempt's savepoint may be open (viaTx).
	saved bool
}

// nested reports whether the attempt runs inside the caller's transaction.
func (h *handle) nested() bool { return h.outer != nil }

// ending returns the statement that ends the attempt's transaction, and
// the command tag it answers when that keeps the attempt's writes.
func (h *handle) ending() (sql, tag string) {
	if h.nested() {
		return "release savepoint " + savepoint, "RELEASE"
	}
	return "commit", "COMMIT"
}

// acquire returns a handle on the Store's database for one attempt, or
// for a statement sent outside an attempt (lookup, describe).
func (s *Store) acquire(ctx context.Context) (*handle, error) {
	switch s.via {
	case viaPool:
		c, err := s.db.(acquirer).Acquire(ctx)
		if err != nil {
			return nil, errfmt.Errorf("idempotency: acquire a connection: %w", pgerr.MarkUnsent(err))
		}
		return &handle{conn: c.Conn(), release: c.Release}, nil
	}
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, errfmt.Errorf("idempotency: wait for the connection: %w", pgerr.MarkUnsent(context.Cause(ctx)))
	}
	h := &handle{release: func() { <-s.turn }}
	if tx, ok := s.db.(pgx.Tx); ok {
		h.conn, h.outer = tx.Conn(), tx
	} else {
		h.conn = s.db.(*pgx.Conn)
	}
	return h, nil
}

// done releases h's connection unless a commit in flight took it over.
func (h *handle) done() {
	if h.release != nil {
		h.release()
		h.release = nil
	}
}

// rollback ends the attempt's transaction without keeping anything,
// unless it has ended already: tx's, or the savepoint's inside the
// caller's transaction (which stays usable, unless the connection failed).
func (h *handle) rollback(ctx context.Context, tx pgx.Tx) {
	if !h.nested() {
		end(ctx, h.conn, tx)
		return
	}
	if h.saved {
		h.saved = false
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_, _ = h.conn.Exec(ctx, "rollback to savepoint "+savepoint+"; release savepoint "+savepoint)
	}
}

// onDB runs fn, which sends statements on s.db outside an attempt: at
// once through a pool, or in its turn through a *pgx.Conn or pgx.Tx. A
// statement that commits on its own waits for its end through a
// *pgx.Conn, whatever ctx does (see detached): fn gets that ctx.
func (s *Store) onDB(ctx context.Context, fn func(ctx context.Context) error) error {
	if s.via == viaPool {
		return fn(ctx)
	}
	h, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer h.done()
	if s.via == viaConn {
		ctx = context.WithoutCancel(ctx)
	}
	return fn(ctx)
}

// detached runs fn, which ends with a commit on h's connection, under the
// Store's Committer: ctx cannot cancel it. If ctx ends first, detached
// returns pgerr.ErrStoppedWaiting at once and leaves h's release to fn's
// goroutine (which Close waits for), which releases the connection when
// fn returns. Otherwise the connection stays with the caller. Through a
// *pgx.Conn, detached waits for fn whatever ctx does (a caller's next
// statement on the connection would otherwise meet the commit's), and
// inside the caller's transaction, where nothing commits, fn runs under
// ctx.
func (s *Store) detached(ctx context.Context, h *handle, fn func(context.Context) error) error {
	switch s.via {
	case viaTx:
		return fn(ctx)
	case viaConn:
		ctx = context.WithoutCancel(ctx)
	}
	var mu sync.Mutex
	left, ended := false, false
	done := h.release
	err := s.pg.CommitBounded(ctx, func(ctx context.Context) error {
		err := func() error {
			defer pgerr.Bound(h.conn.PgConn())() // cleared before the connection goes back to the pool
			return fn(ctx)
		}()
		mu.Lock()
		defer mu.Unlock()
		if ended = true; left {
			done()
		}
		return err
	})
	if errors.Is(err, pgerr.ErrStoppedWaiting) {
		mu.Lock()
		defer mu.Unlock()
		h.release = nil
		if left = true; ended {
			done()
		}
	}
	return err
}
