package pgerr

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgmode"
)

// CommitTimeout bounds every commit nolock runs, from when it is sent. A
// caller's context never cancels a commit (a cancelled wait for a
// synchronous standby leaves the commit visible on the primary but not
// replicated), so a commit needs a bound of its own: one that a healthy
// commit, its wait for a synchronous standby included, never reaches, and
// that frees the connection of one that would otherwise wait for ever (a
// standby that is gone). A commit still unanswered when it ends is cut,
// at its connection's deadline (Bound) or by Commit's context: pgx closes
// the connection and sends a CancelRequest first, which cuts a wait for a
// synchronous standby (the commit may be visible on the primary and not
// yet replicated). Its outcome is unknown (ErrAmbiguousCommit).
const CommitTimeout = time.Minute

// Committer runs the writes that commit for one owner (a Store, a Client):
// it keeps what pgmode learns of the owner's server endpoints (the
// embedded Modes) and the commits its callers stopped waiting for, so that
// the owner's Close waits for them (Close). Every nolock write that
// commits goes through a Committer: Commit, Exec, Row, Begin.
//
// The zero Committer is ready to use, for an owner that calls Close; a
// call with no owner to wait for it uses Inline. A Committer is safe for
// concurrent use and must not be copied after first use.
type Committer struct {
	pgmode.Modes
	inline bool // commits run in their callers' goroutines (see Inline)

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // commits whose callers stopped waiting
}

// Inline returns a Committer for a call with no long-lived owner (a
// function given its db per call): each commit runs in its caller's
// goroutine, which waits for its end, at most CommitTimeout, whatever the
// caller's context does, and gets its own outcome. It learns for that
// call only.
func Inline() *Committer { return &Committer{inline: true} }

// Commit runs commit (a COMMIT, or a statement that commits on its own)
// under a context that keeps ctx's values but not its cancellation or
// deadline, bounded by CommitTimeout instead, so pgx sends no
// CancelRequest for ctx: a cancelled wait for a synchronous standby would
// leave the commit visible on the primary but not replicated. If ctx ends
// first, Commit returns at once with an error wrapping ErrStoppedWaiting
// and ctx.Err() (Of: Unknown); commit goes on to its end, tracked by c so
// that Close waits for it, and its result is dropped. commit must then not
// touch anything the caller uses after Commit returns an error (it must
// release its own connection).
//
// A commit after Close, a commit whose ctx can never end (ctx.Done() is
// nil), and every commit of an Inline Committer run in the caller's
// goroutine, which waits for it whatever ctx does.
func (c *Committer) Commit(ctx context.Context, commit func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), CommitTimeout)
	return c.run(ctx, cctx, cancel, commit)
}

// CommitBounded is Commit for a commit that bounds itself by
// CommitTimeout on its connection (see Bound): it runs under a context
// with ctx's values and neither cancellation nor deadline, for which pgx
// starts no watch, so a commit costs no timer and fewer allocations.
func (c *Committer) CommitBounded(ctx context.Context, commit func(context.Context) error) error {
	return c.run(ctx, context.WithoutCancel(ctx), func() {}, commit)
}

// Bound sets conn's deadline CommitTimeout ahead, the bound Commit gives
// its context, and returns the function that clears it: call that before
// the connection goes back to its pool. A commit still unanswered at the
// deadline fails as a timeout (Of: Unknown; NotSent if not a byte was
// written) and pgx closes the connection (see CommitTimeout).
func Bound(conn *pgconn.PgConn) (unbound func()) { return bound(conn, CommitTimeout) }

func bound(conn *pgconn.PgConn, d time.Duration) (unbound func()) {
	nc := conn.Conn()
	_ = nc.SetDeadline(time.Now().Add(d)) // a closed connection fails at its first write
	return func() {
		if !conn.IsClosed() { // pgx bounds its own close with a deadline: keep it
			_ = nc.SetDeadline(time.Time{})
		}
	}
}

// run runs commit under cctx, which Commit or CommitBounded made from
// ctx, and calls cancel once it returns (see Commit).
func (c *Committer) run(ctx, cctx context.Context, cancel context.CancelFunc, commit func(context.Context) error) error {
	if ctx.Done() == nil || !c.track() {
		defer cancel()
		return commit(cctx)
	}
	done := make(chan error, 1)
	go func() {
		defer c.wg.Done()
		defer cancel()
		done <- commit(cctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		select {
		case err := <-done: // both ready: the outcome is known
			return err
		default:
		}
		return errfmt.Errorf("%w: %w", ErrStoppedWaiting, ctx.Err())
	}
}

// track registers a commit that may outlive its caller's wait, and
// reports false when it must run in the caller's goroutine instead (an
// Inline Committer, or one closed).
func (c *Committer) track() bool {
	if c.inline {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// Close waits for the commits in flight whose callers stopped waiting
// (each at most CommitTimeout). Later commits run in their callers'
// goroutines (see Commit). Close is idempotent and safe to call
// concurrently.
func (c *Committer) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}
