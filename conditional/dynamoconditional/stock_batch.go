package dynamoconditional

// Coalescing: the takes of one bucket that arrive while a write to it is
// in flight are granted together by the next conditional write, so a hot
// item serves many takes per write.

import (
	"context"
	"errors"
	"math"
	"strconv"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/observe"
)

// WithCoalescing turns coalescing of concurrent takes of one bucket in
// this process on (the default) or off. On, while a bucket's write is in
// flight, the takes that arrive meanwhile wait, and the next write grants
// them together (at most WithMaxBatch of them): "SET qty = qty - :sum IF
// qty >= :sum". Off, every take is its own write, sent at once.
func WithCoalescing(on bool) Option {
	return func(c *config) { c.used.Add(setCoalescing); c.coalesce = on }
}

// WithMaxBatch bounds how many takes one write grants (default 128, at
// most 10000).
func WithMaxBatch(n int) Option { return func(c *config) { c.used.Add(setMaxBatch); c.maxBatch = n } }

// bucketKey names one bucket's item: the unit of coalescing.
type bucketKey struct {
	key    string
	bucket int
}

// A bucket's answer to a take that it did not grant, before Take decides
// what the caller hears (with buckets, the others may still cover it).
var (
	errShort   = errors.New("bucket short")   // the bucket held fewer units than the take
	errMissing = errors.New("bucket missing") // the bucket has no item
)

// runTake grants a batch of takes of one bucket, in arrival order, with
// as few conditional writes as the bucket allows: the first asks for
// the whole batch's sum. When the bucket cannot cover it, the write's
// refusal (or a read) says what the bucket holds; the takes that fit in
// it, in arrival order (first fit), are asked for by the next write, and
// the others are refused with errShort. Each refusal of a write that
// returns the bucket's units drops at least one take, so the rounds end.
// A take is refused only when the units its bucket held, less the takes
// granted before it in the batch, could not cover it.
func (s *Stock) runTake(ctx context.Context, k bucketKey, reqs []int64) ([]error, error) {
	if len(reqs) > 1 {
		s.drained.Notify(ctx, observe.Event{Name: EventBatch, Key: k.key + "#" + strconv.Itoa(k.bucket), N: int64(len(reqs))}) // the bucket's statement
	}
	errs := make([]error, len(reqs))
	pending := make([]int, len(reqs))
	for i := range pending {
		pending[i] = i
	}
	for round := 1; ; round++ {
		sum, ok := sumAt(reqs, pending)
		if ok {
			taken, item, err := s.takeBucket(ctx, k.key, k.bucket, sum)
			switch {
			case err != nil:
				return nil, err
			case taken:
				return errs, nil
			case item != nil:
				// The refusal says what the bucket held: sum did not fit.
				qty, err := intAttr(item, QtyAttr)
				if err != nil {
					return nil, errfmt.Errorf("conditional: take %q: bucket %d: %w", k.key, k.bucket, err)
				}
				pending = firstFit(reqs, pending, qty, errs)
				if len(pending) == 0 {
					return errs, nil
				}
				continue
			}
		}
		if round > len(reqs)+backoff.DefaultAttempts {
			return nil, errfmt.Errorf("%w: take %q: bucket %d kept changing", ErrConflict, k.key, k.bucket)
		}
		item, err := getItem(ctx, s.client, s.table, s.itemKey(k.key, k.bucket))
		if err != nil {
			return nil, errfmt.Errorf("conditional: take %q: %w", k.key, err)
		}
		if item == nil {
			for _, i := range pending {
				errs[i] = errMissing
			}
			return errs, nil
		}
		qty, err := intAttr(item, QtyAttr)
		if err != nil {
			return nil, errfmt.Errorf("conditional: take %q: bucket %d: %w", k.key, k.bucket, err)
		}
		if pending = firstFit(reqs, pending, qty, errs); len(pending) == 0 {
			return errs, nil
		}
	}
}

// firstFit returns the takes of pending that qty units cover, in order,
// and refuses the others with errShort.
func firstFit(reqs []int64, pending []int, qty int64, errs []error) []int {
	fit := pending[:0]
	for _, i := range pending {
		if reqs[i] <= qty {
			qty -= reqs[i]
			fit = append(fit, i)
		} else {
			errs[i] = errShort
		}
	}
	return fit
}

// sumAt returns the sum of reqs at pending; ok is false past MaxInt64 (no
// bucket holds that much: a read sorts the batch out).
func sumAt(reqs []int64, pending []int) (sum int64, ok bool) {
	for _, i := range pending {
		if reqs[i] > math.MaxInt64-sum {
			return 0, false
		}
		sum += reqs[i]
	}
	return sum, true
}

// Close stops coalescing: takes not yet sent fail with ErrClosed, and
// Close waits for the writes in flight and their answers. Takes after
// Close fail with ErrClosed. It is idempotent and returns nil.
func (s *Stock) Close() error {
	s.closed.Store(true)
	if s.batch != nil {
		s.batch.Close()
	}
	s.drained.Close() // after the writes in flight: the observer gets every event
	return nil
}
