package cas

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
)

var (
	// ErrConflict means another writer changed the value since it was read:
	// nothing was written. Retry and Store retry it; the final error of an
	// exhausted retry wraps it.
	ErrConflict = errors.New("cas: version conflict")
	// ErrNotFound means no value is stored under the key.
	ErrNotFound = errors.New("cas: not found")
	// ErrExists means Create found a value already stored under the key.
	ErrExists = errors.New("cas: already exists")
	// ErrInvalid marks bad input; the error's text names the argument.
	// Nothing was sent.
	ErrInvalid = errors.New("cas: invalid argument")
	// ErrTooLarge means an encoded value exceeds the backend's limit.
	// Nothing was sent.
	ErrTooLarge = errors.New("cas: value too large")
	// ErrAmbiguousCommit means the write was sent and the connection then
	// failed, so it may or may not have been applied. It is not retried:
	// re-read (Get) and decide.
	ErrAmbiguousCommit = errors.New("cas: commit outcome unknown")
	// ErrClosed means the Store was closed before the update was sent.
	ErrClosed = errors.New("cas: closed")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// checkCtx returns an ErrInvalid if ctx is nil. Every exported call that
// takes a ctx checks it before any I/O.
func checkCtx(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	return nil
}

// notSent returns an error wrapping ctx.Err(), naming the write, if ctx has
// ended, and an ErrInvalid if ctx is nil: a backend checks it before
// sending, so that a write never sent is not reported as
// ErrAmbiguousCommit.
func notSent(ctx context.Context, op, key string) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cas: %s %q not sent: %w", op, key, err)
	}
	return nil
}

// conflict reports whether err is worth a fresh attempt.
func conflict(err error) bool { return errors.Is(err, ErrConflict) || pgerr.Conflict(err) }

// lostRace reports a lost compare-and-set: the winner has committed, so a
// fresh read at once sees its write. A serialization failure or deadlock is
// not one: retried at once, it meets the transaction it lost to again.
func lostRace(err error) bool { return errors.Is(err, ErrConflict) }

// Option configures Retry and NewStore.
type Option func(*config)

type config struct {
	policy  backoff.Policy
	onRetry func(key string, attempt int, err error, delay time.Duration)
	combine bool
	max     int
	timeout time.Duration
	stats   *Stats
}

func newConfig(opts []Option) (config, error) {
	c := config{policy: backoff.Policy{Attempts: 20, Immediate: lostRace}, combine: true, max: 128, timeout: 30 * time.Second}
	for _, o := range opts {
		o(&c)
	}
	if err := c.policy.Validate(); err != nil {
		return c, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch {
	case c.max < 1:
		return c, invalid("max batch %d is below 1", c.max)
	case c.timeout <= 0:
		return c, invalid("timeout %v is not positive", c.timeout)
	}
	return c, nil
}

// WithBackoff sets the jitter window of the first delayed retry (base) and
// its ceiling (cap). Defaults: 2 ms and 500 ms. A lost compare-and-set is
// retried at once the first time; every other retry, and every retry of a
// serialization failure or deadlock, waits a uniform random time in
// [0, min(cap, base·2^k)] (full jitter), k counting from 0.
func WithBackoff(base, cap time.Duration) Option {
	return func(c *config) { c.policy.Base, c.policy.Cap = base, cap }
}

// WithAttempts bounds the attempts, the first included (default 20).
func WithAttempts(n int) Option { return func(c *config) { c.policy.Attempts = n } }

// WithOnRetry calls f before each retry's wait with the key (empty for
// Retry), the attempt that just failed, its error and the delay. Use it to
// find hot keys. f must be fast and safe for concurrent use.
func WithOnRetry(f func(key string, attempt int, err error, delay time.Duration)) Option {
	return func(c *config) { c.onRetry = f }
}

// WithStats counts attempts, conflicts and commits into s.
func WithStats(s *Stats) Option { return func(c *config) { c.stats = s } }

// Stats counts what a Store or Retry did. It is safe for concurrent use;
// read it with Load.
type Stats struct {
	attempts, conflicts, commits atomic.Uint64
}

// StatsSnapshot is a copy of the counters at one moment.
type StatsSnapshot struct {
	Attempts  uint64 // read-decide-write attempts
	Conflicts uint64 // attempts refused because another writer got there first
	Commits   uint64 // successful writes (a combined batch counts once)
}

// Load returns the counters.
func (s *Stats) Load() StatsSnapshot {
	return StatsSnapshot{s.attempts.Load(), s.conflicts.Load(), s.commits.Load()}
}

// count records one attempt and whether it hit a conflict.
func (c *config) count(err error) {
	if c.stats == nil {
		return
	}
	c.stats.attempts.Add(1)
	if conflict(err) {
		c.stats.conflicts.Add(1)
	}
}

// committed records one successful write.
func (c *config) committed() {
	if c.stats != nil {
		c.stats.commits.Add(1)
	}
}

// retry runs op with the configured policy, retrying conflicts.
func (c *config) retry(ctx context.Context, key string, op func(ctx context.Context) error) error {
	err := c.policy.Retry(ctx, func(ctx context.Context, _ int) error {
		err := op(ctx)
		c.count(err)
		return err
	}, conflict, func(attempt int, err error, d time.Duration) {
		if c.onRetry != nil {
			c.onRetry(key, attempt, err, d)
		}
	})
	var ex *backoff.ExhaustedError
	if errors.As(err, &ex) {
		return fmt.Errorf("cas: gave up after %d attempts: %w", ex.Attempts, ex.Last)
	}
	return err
}

// Beginner is what Retry needs: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Retry runs fn in a fresh transaction and commits; when fn or the commit
// fails with a conflict (ErrConflict, e.g. from Exec, or SQLSTATE 40001 or
// 40P01), it runs again in a new transaction after a backoff, until it
// succeeds, fails otherwise, the attempts run out (the error says how many
// were made and wraps the last conflict) or ctx ends.
//
// fn must read what it decides on inside tx, so each attempt decides on a
// fresh read, and must have no side effects outside tx. A commit whose
// outcome is unknown is returned as ErrAmbiguousCommit and not retried.
func Retry(ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) error, opts ...Option) error {
	switch {
	case ctx == nil:
		return invalid("ctx is nil")
	case pgarg.NilDB(db):
		return invalid("db is nil")
	case fn == nil:
		return invalid("fn is nil")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	return cfg.retry(ctx, "", func(ctx context.Context) error {
		tx, err := pgerr.Begin(ctx, db)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			if pgerr.Ambiguous(err) {
				return fmt.Errorf("%w: %w", ErrAmbiguousCommit, err)
			}
			return err
		}
		cfg.committed()
		return nil
	})
}

// Execer is what Exec needs: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Exec runs a conditional statement, typically
//
//	UPDATE docs SET body = $1, version = version + 1 WHERE id = $2 AND version = $3
//
// and returns ErrConflict when it changed no row: the version moved on (or
// the row is gone; read it again to tell). Use it inside Retry.
func Exec(ctx context.Context, db Execer, sql string, args ...any) error {
	switch {
	case ctx == nil:
		return invalid("ctx is nil")
	case pgarg.NilDB(db):
		return invalid("db is nil")
	}
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrConflict
	}
	return nil
}
