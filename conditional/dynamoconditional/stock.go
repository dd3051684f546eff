package dynamoconditional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/combine"
	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/observe"
)

// Stock sells units of keys (SKUs, tickets, quota) from a DynamoDB
// table, never below zero, without a lock: a take is a conditional
// UpdateItem, "SET qty = qty - :n IF qty >= :n" (with coalescing, :n is
// the sum of the takes that write carries), and the item decides.
//
// Item layout: one item per bucket of a key, whose partition key
// (WithKeyAttributes, default "pk", a string) is the key, "#" and the bucket's decimal
// number ("sku-42#0", "sku-42#1", ...), and whose QtyAttr ("qty", a
// number) holds the bucket's units. The mapping is one to one: the part
// after the last "#" is the bucket. Put creates the items. Keep other items
// out of the table, or out of this key space.
//
// Buckets: DynamoDB serves about 1,000 writes per second per item (its
// per-partition limit), whatever the client does; a hotter key needs its
// stock spread over buckets (WithBuckets), each an item of its own.
// A take goes to a random bucket; when that bucket cannot cover it, Take
// reads every bucket and takes from the fullest one alone if it covers the
// request, else from several in one TransactWriteItems that lowers the
// fullest to a common level, each update conditioned on the bucket still
// holding the units it gives. Only that last path needs a server with
// transactions (DynamoDB has them; dynalite does not, and there it fails
// with an error wrapping errors.ErrUnsupported).
//
// Coalescing (WithCoalescing, on by default): while a bucket's write is
// in flight, the takes of that bucket that arrive meanwhile in this
// process wait, and the next write grants them together, so one item
// serves many takes per write (see runTake in stock_batch.go). Processes
// each coalesce their own takes; buckets spread them over items.
//
// Guarantee: never more units granted than were put, no bucket below zero,
// across any number of processes; a take is whole (n units or none). With
// one bucket, ErrSoldOut means the item could not cover n when the write
// was judged. With buckets, it means the buckets, read one after another
// after the take's own bucket refused, held fewer than n units in all:
// exact while no Put runs concurrently. Coalesced takes are judged in
// arrival order: a take is refused only when its bucket, less the takes
// granted before it in the same write, could not cover it. Not promised:
// fairness (a large
// take across buckets may lose to small ones, see ErrConflict), an atomic
// Put across buckets, or an answer for a take whose outcome is unknown
// (ErrAmbiguousCommit; a take is not idempotent).
//
// A Stock is safe for concurrent use, and several may share a table if
// they agree on the number of buckets. Close it when done: it stops the
// goroutines that send coalesced takes.
type Stock struct {
	client  DynamoDBAPI
	table   string
	keys    keyAttrs
	buckets int
	rand    func(n int) int
	retry   retrier
	batch   *combine.Combiner[bucketKey, int64, struct{}] // nil without coalescing
	closed  atomic.Bool
	obs     observe.Observer
	drained *notify.Queue // obs's, for the events of the coalescing drainers, which obs must not hold up
}

// MaxBuckets bounds WithBuckets: a take across buckets writes
// them in one transaction, which holds at most 100 actions.
const MaxBuckets = 100

// WithBuckets spreads each key's stock over n items (default 1, at
// most MaxBuckets), so a key can take n times the writes one item
// allows. Every Stock on a table must use the same n: a bucket it
// does not know of is never read. Takes that one bucket cannot cover need
// transactions (see Stock).
func WithBuckets(n int) Option { return func(c *config) { c.used.Add(setBuckets); c.buckets = n } }

// NewStock returns a Stock on table, whose partition key is a string
// attribute named "pk" unless WithKeyAttributes says otherwise. client is
// usually a *dynamodb.Client.
func NewStock(client DynamoDBAPI, table string, opts ...Option) (*Stock, error) {
	cfg := config{keys: defaultKeys, buckets: 1, coalesce: true, maxBatch: 128}
	if err := apply(&cfg, opts, "NewStock", stockSetters); err != nil {
		return nil, err
	}
	if ddbarg.NilClient(client) {
		return nil, condcore.Invalid("client is nil")
	}
	if err := validTable("table", table); err != nil {
		return nil, err
	}
	if err := cfg.keys.valid(QtyAttr); err != nil {
		return nil, err
	}
	if cfg.buckets < 1 || cfg.buckets > MaxBuckets {
		return nil, condcore.Invalid("WithBuckets(%d): outside [1, %d]", cfg.buckets, MaxBuckets)
	}
	if cfg.maxBatch < 1 || cfg.maxBatch > 10000 {
		return nil, condcore.Invalid("WithMaxBatch(%d): outside [1, 10000]", cfg.maxBatch)
	}
	s := &Stock{client: client, table: table, keys: cfg.keys, buckets: cfg.buckets, rand: rand.IntN, retry: newRetrier(cfg.log), obs: cfg.obs, drained: notify.New(cfg.obs, 1024)}
	if cfg.coalesce {
		s.batch = combine.New(cfg.maxBatch, ErrClosed, func(ctx context.Context, k bucketKey, reqs []int64) ([]struct{}, []error, error) {
			errs, err := s.runTake(ctx, k, reqs)
			return make([]struct{}, len(reqs)), errs, err
		})
	}
	return s, nil
}

// itemKey returns the key of one bucket's item.
func (s *Stock) itemKey(key string, bucket int) map[string]types.AttributeValue {
	return s.keys.item(key + "#" + strconv.Itoa(bucket))
}

// Take takes n units of key: nil means all n are yours; ErrSoldOut means
// none were taken because the stock cannot cover n; ErrNotFound means
// the key has no items. ErrAmbiguousCommit means the write was sent and
// its answer lost: it may have applied, so read Available before retrying.
// With buckets, ErrConflict means concurrent takes changed the buckets
// under every attempt to take across them, and an error wrapping
// errors.ErrUnsupported means the server has no transactions; then nothing
// was taken.
//
// Cancelling ctx abandons a take not yet sent. Coalesced, a take that was
// sent is waited for while any take of its batch waits, and answered; not
// coalesced, the outcome of a sent take is unknown (ErrAmbiguousCommit). After Close,
// Take returns ErrClosed.
func (s *Stock) Take(ctx context.Context, key string, n int64) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArg("key", key); err != nil {
		return err
	}
	if n <= 0 {
		return condcore.Invalid("n must be positive, got %d", n)
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("take %q", key)); err != nil {
		return err
	}
	return condcore.ObservedErr(ctx, s.obs, condcore.Take, false, observe.Event{Key: key, N: n}, func(ctx context.Context) error { return s.take(ctx, key, n) })
}

// take is Take once its arguments are checked.
func (s *Stock) take(ctx context.Context, key string, n int64) error {
	if s.closed.Load() {
		return ErrClosed
	}
	k := bucketKey{key: key}
	if s.buckets > 1 {
		k.bucket = s.rand(s.buckets)
	}
	var err error
	if s.batch != nil {
		_, err = s.batch.Do(ctx, k, n)
	} else {
		var errs []error
		if errs, err = s.runTake(ctx, k, []int64{n}); err == nil {
			err = errs[0]
		}
	}
	switch {
	case err == nil:
		return nil
	case (errors.Is(err, errShort) || errors.Is(err, errMissing)) && s.buckets > 1:
		// This bucket cannot cover n; the others may.
		return s.takeAcross(ctx, key, n)
	case errors.Is(err, errMissing):
		return ErrNotFound
	case errors.Is(err, errShort):
		return ErrSoldOut
	}
	return err
}

// takeBucket takes n units from one bucket with one conditional write. On
// a refusal (the bucket is missing or short) it returns taken false and
// the item as the server returned it, if it did.
func (s *Stock) takeBucket(ctx context.Context, key string, bucket int, n int64) (taken bool, item map[string]types.AttributeValue, err error) {
	_, err = s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 s.itemKey(key, bucket),
		UpdateExpression:                    aws.String("SET #q = #q - :n"),
		ConditionExpression:                 aws.String("#q >= :n"),
		ExpressionAttributeNames:            map[string]string{"#q": QtyAttr},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":n": numAttr(n)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, ddberr.NoBlindRetries)
	if err == nil {
		return true, nil, nil
	}
	if item, ok := ddberr.ConditionFailed(err); ok {
		return false, item, nil
	}
	return false, nil, errfmt.Errorf("conditional: take %q: %w", key, writeErr(err))
}

// read returns every bucket's units, reading them one after another with
// strongly consistent reads; a missing bucket counts as 0, and found says
// whether any exists.
func (s *Stock) read(ctx context.Context, key string) (qty []int64, found bool, err error) {
	qty = make([]int64, s.buckets)
	for b := range qty {
		item, err := getItem(ctx, s.client, s.table, s.itemKey(key, b))
		if err != nil {
			return nil, false, err
		}
		if item == nil {
			continue
		}
		found = true
		if qty[b], err = intAttr(item, QtyAttr); err != nil {
			return nil, false, errfmt.Errorf("bucket %d: %w", b, err)
		}
	}
	return qty, found, nil
}

// Put adds n units to key, creating its items as needed: a restock or a
// return. With buckets, the units are spread evenly over them, one ADD per
// bucket (each bucket's item is created, with 0 units when n is smaller
// than the number of buckets). Put is not atomic across buckets: on an
// error, the message says how many units were added before it, and on
// ErrAmbiguousCommit one more bucket's share may have been. A bucket holds
// at most MaxInt64/buckets units (more is refused with an error, before
// any I/O when n alone is too large), so the sum always fits an int64.
func (s *Stock) Put(ctx context.Context, key string, n int64) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArg("key", key); err != nil {
		return err
	}
	if n <= 0 {
		return condcore.Invalid("n must be positive, got %d", n)
	}
	limit := math.MaxInt64 / int64(s.buckets)
	if n > limit*int64(s.buckets) {
		return condcore.Invalid("n %d is more than %d buckets can hold", n, s.buckets)
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("put %q", key)); err != nil {
		return err
	}
	per, extra := n/int64(s.buckets), n%int64(s.buckets)
	var added int64
	for b := 0; b < s.buckets; b++ {
		share := per
		if int64(b) < extra {
			share++
		}
		_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(s.table),
			Key:                       s.itemKey(key, b),
			UpdateExpression:          aws.String("ADD #q :n"),
			ConditionExpression:       aws.String("attribute_not_exists(#q) OR #q <= :limit"),
			ExpressionAttributeNames:  map[string]string{"#q": QtyAttr},
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": numAttr(share), ":limit": numAttr(limit - share)},
		}, ddberr.NoBlindRetries)
		if _, ok := ddberr.ConditionFailed(err); ok {
			return errfmt.Errorf("conditional: put %q: bucket %d would exceed %d units (%d of %d units added)", key, b, limit, added, n)
		}
		if err != nil {
			return errfmt.Errorf("conditional: put %q (%d of %d units added before): %w", key, added, n, writeErr(err))
		}
		added += share
	}
	return nil
}

// Available returns the units of key not yet taken, summed over its
// buckets, read one after another with strongly consistent reads (one read
// per bucket). It is a snapshot, not an atomic one: concurrent takes may
// change it at once.
func (s *Stock) Available(ctx context.Context, key string) (int64, error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return 0, err
	}
	if err := condcore.ValidArg("key", key); err != nil {
		return 0, err
	}
	qty, found, err := s.read(ctx, key)
	if err != nil {
		return 0, errfmt.Errorf("conditional: available %q: %w", key, err)
	}
	if !found {
		return 0, ErrNotFound
	}
	var total int64
	for _, q := range qty {
		total += q
	}
	return total, nil
}
