package dynamoconditional

// A take that no single bucket of a Stock covers: read every bucket,
// then take from the fullest alone, or from several in one transaction
// that leaves them as level as it can.

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
)

// errBucketsMoved marks an attempt to take across buckets that lost a race;
// the next attempt reads the buckets again.
var errBucketsMoved = errfmt.Errorf("%w: buckets changed while taking across them", ErrConflict)

// takeAcross reads every bucket of key and takes n units: with one
// conditional write to the fullest bucket when it covers n, else with one
// transaction over several (see transact). It retries, with jittered
// backoff, when the buckets changed in between.
func (s *Stock) takeAcross(ctx context.Context, key string, n int64) error {
	err := s.retry.retry(ctx, key, func(ctx context.Context) error {
		qty, found, err := s.read(ctx, key)
		switch {
		case err != nil:
			return errfmt.Errorf("conditional: take %q: %w", key, err)
		case !found:
			return ErrNotFound
		}
		var total int64
		best := 0
		for b, q := range qty {
			total += q // at most buckets × MaxInt64/buckets: see Put
			if q > qty[best] {
				best = b
			}
		}
		if total < n {
			return ErrSoldOut
		}
		if qty[best] >= n {
			taken, _, err := s.takeBucket(ctx, key, best, n)
			if err == nil && !taken {
				err = errBucketsMoved
			}
			return err
		}
		return s.transact(ctx, key, n, qty)
	}, func(err error) bool { return errors.Is(err, errBucketsMoved) })
	if errors.Is(err, backoff.ErrExhausted) {
		return errfmt.Errorf("conditional: take %q across buckets: %w", key, err)
	}
	return err
}

// transact takes n units across buckets in one TransactWriteItems, as
// levelled plans it. Each update is conditioned on the bucket still
// holding the units it gives, so a concurrent take that leaves enough does
// not cancel the transaction, and one that does not cannot drive a bucket
// below zero.
func (s *Stock) transact(ctx context.Context, key string, n int64, qty []int64) error {
	var items []types.TransactWriteItem
	for b, d := range levelled(qty, n) {
		if d == 0 {
			continue
		}
		items = append(items, types.TransactWriteItem{Update: &types.Update{
			TableName:                 aws.String(s.table),
			Key:                       s.itemKey(key, b),
			UpdateExpression:          aws.String("SET #q = #q - :d"),
			ConditionExpression:       aws.String("#q >= :d"),
			ExpressionAttributeNames:  map[string]string{"#q": QtyAttr},
			ExpressionAttributeValues: map[string]types.AttributeValue{":d": numAttr(d)},
		}})
	}
	_, err := s.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}, ddberr.NoBlindRetries)
	switch {
	case err == nil:
		return nil
	case ddberr.CancelledOnlyFor(err, "ConditionalCheckFailed", "TransactionConflict"):
		// A bucket no longer holds its share (ConditionalCheckFailed), or
		// another transaction held it (TransactionConflict): read again.
		return errBucketsMoved
	case unsupported(err):
		return errfmt.Errorf("conditional: take %q across %d buckets needs TransactWriteItems: %w: %w",
			key, len(items), errors.ErrUnsupported, err)
	}
	return errfmt.Errorf("conditional: take %q across buckets: %w", key, writeErr(err))
}

// levelled returns how many units to take from each bucket, n in all
// (n <= the sum of qty), so that the buckets end as level as they can: the
// fullest are lowered to a common level (within one unit), the others left
// alone. That leaves every bucket the most units it can keep, so concurrent
// single-bucket takes rarely leave one short of its share and cancel the
// transaction; emptying whole buckets instead, conditioned on the units
// read, would be cancelled by any concurrent take of a bucket it touches.
func levelled(qty []int64, n int64) []int64 {
	order := make([]int, len(qty))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(qty[b], qty[a]) })
	take := make([]int64, len(qty))
	var sum int64 // of the k fullest; fits, as every bucket holds at most MaxInt64/buckets
	for k := 1; k <= len(order); k++ {
		sum += qty[order[k-1]]
		var next int64
		if k < len(order) {
			next = qty[order[k]]
		}
		// Lowering the k fullest to the next one's level frees sum - k·next.
		if sum-int64(k)*next < n {
			continue
		}
		level, extra := (sum-n)/int64(k), (sum-n)%int64(k)
		for i, b := range order[:k] {
			final := level
			if int64(i) < extra {
				final++
			}
			take[b] = qty[b] - final
		}
		break
	}
	return take
}
