// Package pgoutcome tells what a failed PostgreSQL write proves, the same
// way every nolock package judges its own writes, so that code of yours
// beside them can do the same.
//
// A write that commits (a COMMIT, or a statement outside an explicit
// transaction) ends in one of four outcomes:
//
//	Committed  nil error
//	NotSent    nothing reached the server: retrying anything is safe
//	Refused    the server answered and rolled it back (or pgx refused the
//	           statement before sending it): nothing changed
//	Unknown    it may have committed: retry only with the same
//	           idempotency key or condition, or read the state first
//
// Of judges by what may have reached the server, not by the error's type
// alone: a FATAL or connection-class error (SQLSTATE 08*, 57P01-57P05,
// PgBouncer's own "server conn crashed?") ends the session after the
// statement was written and is Unknown; pgx's SafeToRetry is not proof
// for a COMMIT (pgx v5.12 reports a reply lost after a simple-protocol
// COMMIT as "conn closed", marked safe to retry); a pool's Acquire that
// timed out sent nothing. Inside an explicit transaction nothing commits
// before the COMMIT, so a failed statement there never needs Of.
//
// Commit runs a commit so that the caller's context cannot cancel it on the
// server: with a synchronous standby, PostgreSQL answers a cancelled commit
// wait by keeping the commit, visible on the primary but not replicated,
// and a failover then loses it. See docs/deploying.md.
package pgoutcome

import (
	"context"
	"errors"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/outcome"
	"github.com/nolock/nolock/internal/pgerr"
)

// Outcome is what an error proves about a write that commits.
type Outcome int

// The outcomes.
const (
	Committed = Outcome(outcome.Committed) // the write committed (a nil error)
	NotSent   = Outcome(outcome.NotSent)   // nothing reached the server: safe to send again
	Refused   = Outcome(outcome.Refused)   // rolled back: nothing changed
	Unknown   = Outcome(outcome.Unknown)   // it may have committed: send again only if idempotent by its key or condition
)

// String names the outcome in words: "committed", "not sent", "refused"
// or "unknown".
func (o Outcome) String() string { return outcome.Outcome(o).String() }

// ErrStoppedWaiting is part of the error a nolock call returns when the
// caller's context ended while its commit was in flight (Of: Unknown); the
// commit runs on, and the Close of the value that made the call waits for
// it.
var ErrStoppedWaiting = pgerr.ErrStoppedWaiting

// ErrInvalid is wrapped by the error Commit returns for a nil argument,
// which it names; nothing was run.
var ErrInvalid = errors.New("pgoutcome: invalid argument")

// Of classifies err, returned by a statement that commits: a COMMIT, or a
// statement outside an explicit transaction.
func Of(err error) Outcome { return Outcome(pgerr.Of(err)) }

// Commit runs commit (typically tx.Commit, or one statement outside a
// transaction on a connection you hold) under a context that keeps ctx's
// values but not its cancellation or deadline, so pgx sends no
// CancelRequest for it; the commit is bounded by CommitTimeout instead.
// Commit runs commit in the calling goroutine and returns its own outcome,
// even when ctx ends first: a commit runs to its end (at most
// CommitTimeout), and the caller that started it is the one that waits. A
// nil ctx or commit is refused with an error wrapping ErrInvalid (Of:
// NotSent).
func Commit(ctx context.Context, commit func(context.Context) error) error {
	switch {
	case ctx == nil:
		return pgerr.MarkUnsent(errfmt.Errorf("%w: ctx is nil", ErrInvalid))
	case commit == nil:
		return pgerr.MarkUnsent(errfmt.Errorf("%w: commit is nil", ErrInvalid))
	}
	return pgerr.Inline().Commit(ctx, commit)
}

// CommitTimeout bounds a commit run by Commit, and every commit nolock's
// packages run, from when it is sent: a commit still unanswered then is
// abandoned and its outcome is Unknown. pgx closes its connection and sends
// a CancelRequest first, which cuts a wait for a synchronous standby: the
// commit may be visible on the primary and not yet replicated. A healthy commit,
// its wait for a synchronous standby included, never reaches it.
const CommitTimeout = pgerr.CommitTimeout

// Conflict reports a serialization failure (40001) or deadlock (40P01):
// the transaction rolled back, and running it again afresh may succeed.
// Retry after a random pause, not at once: the transaction it lost to may
// still be running.
func Conflict(err error) bool { return pgerr.Conflict(err) }
