// Package backoff is nolock's retry policy: exponential backoff with full
// jitter, bounded by a number of attempts and by the caller's context.
//
// Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter") waits
// a uniformly random time in [0, min(Cap, Base·2^(k-1))] before the k-th
// retry. Among the usual schemes it does the least total work under
// contention, because competing writers spread out instead of colliding again
// in lock-step. Every retry pauses, the first included: a deadlock victim or
// a serialization failure retried at once meets the transaction it lost to
// before that one has finished, and re-creates the conflict. A caller whose
// failure a fresh read resolves at once (a lost compare-and-set, where the
// winner has already committed) marks it with Policy.Immediate.
//
// The package is internal; cas, dynamolock and idempotency expose its knobs
// through their own options.
package backoff

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/nolock/nolock/internal/errfmt"
)

// Defaults used for zero fields of a Policy.
const (
	DefaultBase     = 2 * time.Millisecond
	DefaultCap      = 500 * time.Millisecond
	DefaultAttempts = 10
)

// Policy says how often and how long to retry. The zero value is usable and
// means the defaults. A Policy is a value; it is safe for concurrent use.
type Policy struct {
	// Base is the ceiling of the first delayed retry's jitter window.
	Base time.Duration
	// Cap bounds every window.
	Cap time.Duration
	// Attempts bounds the total number of tries, the first included.
	Attempts int
	// Immediate, if not nil, reports a failure whose first retry need not
	// wait (Retry only). nil: every retry waits.
	Immediate func(error) bool
	// Int64N returns a uniform random number in [0, n); nil means
	// math/rand/v2's concurrency-safe generator. Tests inject their own.
	Int64N func(n int64) int64
}

// withDefaults fills zero fields.
func (p Policy) withDefaults() Policy {
	if p.Base == 0 {
		p.Base = DefaultBase
	}
	if p.Cap == 0 {
		p.Cap = DefaultCap
	}
	if p.Attempts == 0 {
		p.Attempts = DefaultAttempts
	}
	if p.Int64N == nil {
		p.Int64N = rand.Int64N
	}
	return p
}

// Validate reports a setting that cannot work, naming it.
func (p Policy) Validate() error {
	switch {
	case p.Base < 0:
		return errfmt.Errorf("backoff: base %v is negative", p.Base)
	case p.Cap < 0:
		return errfmt.Errorf("backoff: cap %v is negative", p.Cap)
	case p.Cap != 0 && p.Base > p.Cap:
		return errfmt.Errorf("backoff: base %v exceeds cap %v", p.Base, p.Cap)
	case p.Attempts < 0:
		return errfmt.Errorf("backoff: attempts %d is negative", p.Attempts)
	}
	return nil
}

// Delay returns how long to wait before attempt n (1 is the first attempt,
// which does not wait). Attempt n > 1 waits a uniform random time in
// [0, min(Cap, Base·2^(n-2))].
func (p Policy) Delay(n int) time.Duration {
	p = p.withDefaults()
	if n <= 1 {
		return 0
	}
	window := p.Cap
	if shift := n - 2; shift < 62 && p.Base<<shift > 0 && p.Base<<shift < p.Cap {
		window = p.Base << shift
	}
	return time.Duration(p.Int64N(int64(window) + 1))
}

// ErrExhausted is in the chain of the error Retry returns when every
// attempt failed with a retryable error: "gave up after N attempts: last",
// wrapping the last failure, so errors.Is(err, cas.ErrConflict) still
// holds. It is a sentinel, not a type, so a package that returns the
// error leaves no type of this internal package for its callers to name.
var ErrExhausted = errors.New("gave up")

// Last returns the last attempt's error when err says the attempts ran
// out (it wraps ErrExhausted), and ok false otherwise.
func Last(err error) (last error, ok bool) {
	switch e := err.(type) {
	case nil:
		return nil, false
	case interface{ Unwrap() []error }:
		errs := e.Unwrap()
		if len(errs) == 2 && errs[0] == ErrExhausted {
			return errs[1], true
		}
		for _, err := range errs {
			if last, ok := Last(err); ok {
				return last, true
			}
		}
		return nil, false
	}
	return Last(errors.Unwrap(err))
}

// Retry calls op until it returns nil or a non-retryable error, the attempts
// run out (then an error wrapping ErrExhausted), or ctx ends (then an error wrapping both
// ctx.Err() and the last failure). op receives the attempt number, from 1.
// onRetry, if not nil, is called before each wait with the attempt that just
// failed, its error and the delay about to be slept.
func (p Policy) Retry(ctx context.Context, op func(ctx context.Context, attempt int) error,
	retryable func(error) bool, onRetry func(attempt int, err error, delay time.Duration)) error {
	if err := p.Validate(); err != nil {
		return err
	}
	p = p.withDefaults()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := op(ctx, attempt)
		if err == nil || !retryable(err) {
			return err
		}
		if attempt >= p.Attempts {
			return errfmt.Errorf("%w after %d attempts: %w", ErrExhausted, attempt, err)
		}
		d := p.Delay(attempt + 1)
		if attempt == 1 && p.Immediate != nil && p.Immediate(err) {
			d = 0
		}
		if onRetry != nil {
			onRetry(attempt, err, d)
		}
		if serr := Sleep(ctx, d); serr != nil {
			return errfmt.Errorf("%w; last failure: %w", serr, err)
		}
	}
}

// Sleep waits for d or until ctx ends, whichever is first, and returns
// ctx.Err() in the second case. A zero d returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
