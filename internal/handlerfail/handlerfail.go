// Package handlerfail is how inbox and partition judge a message handler's
// failure: whether it is the message's (it counts toward the attempts
// that park it), marked permanent (it parks at once), or the database's
// trouble under the handler (retried without counting, for a while). Each
// package exports its own Permanent, IsPermanent, HandlerError and
// PanicError on top of it, with the same meaning.
package handlerfail

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/pgerr"
)

// Kind is what a handler's failure says about its message.
type Kind int

const (
	// Counted is the message's failure: it counts toward the attempts.
	Counted Kind = iota
	// Permanent was marked so by the handler: the message parks at once.
	Permanent
	// Database is the database's trouble under the handler, not the
	// message's: a serialization failure or deadlock (40001, 40P01), a
	// lost or refused connection, the server shutting down or short of
	// resources. It is retried with backoff; a Tally counts it only once
	// it keeps happening.
	Database
)

// permanent marks an error that retrying will not fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// MarkPermanent marks err as permanent (nil stays nil).
func MarkPermanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked.
func IsPermanent(err error) bool { return errors.As(err, new(permanent)) }

// Classify judges err, returned by a handler. connLost says the handler's
// connection closed under it; expired that the batch's own time ran out
// (the handler was too slow, whatever error that caused), which counts.
// statement_timeout (57014) and lock_timeout (55P03) count too: they may
// recur on every attempt. A panic counts (it wraps no database error).
func Classify(err error, connLost, expired bool) Kind {
	switch {
	case IsPermanent(err):
		return Permanent
	case expired:
		return Counted
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03") {
		return Counted
	}
	var connErr *pgconn.ConnectError
	if connLost || pgerr.ServerTrouble(err) || pgerr.Conflict(err) || errors.As(err, &connErr) || pgerr.Unsent(err) {
		return Database
	}
	return Counted
}

// Tally follows one message's (or batch's) failures in a row and says
// which count toward its attempts: every Counted or Permanent one, and a
// Database one only after Bound of them came in a row, so that a message
// whose handler deadlocks or ends its own connection every time is still
// parked, after at most Bound uncounted tries between counted ones.
type Tally struct {
	Bound int
	run   int
}

// Counts records a failure of kind k and reports whether it counts.
func (t *Tally) Counts(k Kind) bool {
	if k != Database {
		t.run = 0
		return true
	}
	t.run++
	return t.run > t.Bound
}
