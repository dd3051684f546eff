package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
)

// retried makes attempt until it succeeds or fails for good: at once
// again while it ends in errResend (see settled), and after a backoff
// while it fails retryably, within the Store's WithAttempts.
//
// When most of the calls p has seen were replays, the key's record is
// read first (replayFirst): a replay then costs that read alone, and
// does not queue behind the Store's call in flight. Otherwise, and when
// the record is absent or expired (or the read failed retryably), a call of the Store with the key in
// flight is waited for first, and while a request in flight holds the
// key (errBusy), attempt is made again after a pause; both up to the
// Store's wait (see keywait.go). attempt's dup says the call has waited
// for the key: it is then likely to find the key's record, and reads it
// first.
func (s *Store) retried(ctx context.Context, p *plan, scope, key string, fp []byte, attempt func(ctx context.Context, dup bool) (Result, error)) (Result, error) {
	if p.readFirst() {
		if res, done, err := s.replayFirst(ctx, p, scope, key, fp); done && !retryable(err) {
			return res, err
		}
	}
	var res Result
	wait := s.waitFor(ctx)
	start := time.Now()
	leave, waited, err := s.queueKey(ctx, scope, key, start, wait)
	if err != nil {
		return Result{}, err
	}
	defer leave()
	err = s.policy.Retry(ctx, func(ctx context.Context, _ int) error {
		var err error
		res, err = settled(ctx, func() (Result, error) { return s.whileBusy(ctx, scope, key, start, wait, waited, attempt) })
		return err
	}, retryable, idemrecord.RetryLogger(ctx, s.log, key))
	if errors.Is(err, backoff.ErrExhausted) {
		return Result{}, errfmt.Errorf("idempotency: key %q: %w", key, err)
	}
	return res, err
}

// whileBusy makes attempt, and while it finds the key held by a request
// in flight (errBusy), pauses and asks whether the key may be free (one
// round trip each) until it may, then makes attempt again; the pauses end
// with ErrInProgress once wait has passed since start. attempt's dup says
// the call has waited for the key (in queueKey, as waited says, or here).
func (s *Store) whileBusy(ctx context.Context, scope, key string, start time.Time, wait time.Duration, waited bool,
	attempt func(ctx context.Context, dup bool) (Result, error)) (Result, error) {
	for n := 1; ; n++ {
		res, err := attempt(ctx, waited)
		if !errors.Is(err, errBusy) {
			return res, err
		}
		waited = true
		for ; ; n++ {
			if err := s.awaitKey(ctx, key, n, start, wait); err != nil {
				return Result{}, err
			}
			if s.mayBeFree(ctx, scope, key) {
				break
			}
		}
	}
}

// errResend means the attempt's claim ran nothing and is made again: the
// server connection did not keep a named prepared statement (see
// pgmode.Modes.Learn), and the claim is sent again unnamed.
var errResend = errors.New("idempotency: the claim ran nothing; sending it again")

// settled runs attempt again (up to 10 times, while ctx lives) as long as
// it ends in errResend: fn did not run then, so these do not count
// against WithAttempts, which bounds runs of the effect that rolled back.
func settled(ctx context.Context, attempt func() (Result, error)) (Result, error) {
	for i := 0; ; i++ {
		res, err := attempt()
		if !errors.Is(err, errResend) || i == 9 || ctx.Err() != nil {
			return res, err
		}
	}
}

// retryable reports whether Do may run the whole transaction again: it
// rolled back for a reason a new attempt may not meet. That includes a
// statement pgx had prepared that no longer fits the table (0A000 from
// the server's revalidation, after a change to a column's type): pgx
// drops it, and the next attempt prepares it again.
func retryable(err error) bool {
	if errors.Is(err, ErrAmbiguousCommit) {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.Is(err, errResend) || pgmode.MissingNamed(err) || pgerr.Conflict(err) ||
		errors.As(err, &pgErr) && pgErr.Code == "0A000" && pgErr.Routine == "RevalidateCachedQuery"
}
