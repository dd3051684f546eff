package cas

import (
	"context"

	"github.com/nolock/nolock/internal/casstore"
	"github.com/nolock/nolock/observe"
)

// Retry runs op until it returns nil or an error that is not a conflict,
// the attempts run out (the error says how many were made and wraps the
// last conflict) or ctx ends. A conflict is ErrConflict, or an error with
// a SQLState method (such as *pgconn.PgError) reporting a serialization
// failure (40001) or a deadlock (40P01). A lost compare-and-set is retried
// at once, since the winner's write is already readable; the others after
// a backoff with full jitter.
//
// op must read what it decides on afresh in each attempt and have no side
// effects beyond the write it makes. An error wrapping ErrAmbiguousCommit
// is returned, never retried. pgcas.Retry runs op as a PostgreSQL
// transaction.
func Retry(ctx context.Context, op func(ctx context.Context) error, opts ...Option) error {
	if ctx == nil {
		return casstore.Invalid("ctx is nil")
	}
	cfg, err := newRetryConfig(opts)
	if err != nil {
		return err
	}
	ctx, cl := cfg.begin(ctx, CallRetry, "")
	defer cl.sp.Unwound(observe.Event{Name: EventFailed})
	if op == nil {
		err = casstore.Invalid("op is nil")
	} else {
		err = cfg.retry(ctx, "", op, true)
	}
	cl.endRetry(cfg.policy.Attempts, err)
	return err
}
