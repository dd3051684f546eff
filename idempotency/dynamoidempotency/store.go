package dynamoidempotency

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/observe"
)

// DynamoDBAPI is what a Store needs from a *dynamodb.Client; tests wrap it
// to inject faults. It may grow in later versions.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
}

// Func computes a request's effect as DynamoDB writes (conditional
// puts, updates, deletes and condition checks) and the result to store
// for the key. Do writes them and the key's record in one
// TransactWriteItems, so they apply together or not at all. It may read
// (to decide, or to return Terminal), but must write nothing itself, and
// may run more than once: when a concurrent duplicate wins, its writes are
// discarded. At most 99 writes (DynamoDB allows 100 per transaction).
type Func func(ctx context.Context) (writes []types.TransactWriteItem, result []byte, err error)

// Store records idempotency keys in a DynamoDB table, written in the
// same TransactWriteItems as the effect they guard. It is the DynamoDB
// counterpart of idempotency.Store, with these differences, all DynamoDB's:
//
//   - A concurrent duplicate does not wait on the first: both compute
//     their writes, the transactions race, exactly one commits, and the
//     other replays its record (or reports ErrMismatch).
//   - Expiry is judged by this process's clock (DynamoDB conditions have
//     no server time): leave a margin for clock skew between writers. The
//     record's ttl attribute (epoch seconds) lets DynamoDB's TTL delete
//     expired records; enable TTL on it. There is no Reap.
//   - An effect whose own condition fails cancels the transaction:
//     Do returns an error wrapping *types.TransactionCanceledException and
//     stores nothing. To store a refusal, decide it in fn (read, then
//     return Terminal) and let a condition guard the race.
//
// The table's partition key is a string attribute (default "pk"); the
// record's item key is derived from scope and key with a "nolock-idem/"
// prefix, so the table may hold other items. A Store is safe for
// concurrent use; it starts no goroutines.
type Store struct {
	client    DynamoDBAPI
	table     string
	pk, sk    string
	retention time.Duration
	wait      time.Duration
	policy    backoff.Policy
	now       func() time.Time
	log       *slog.Logger // never nil
	obs       observe.Observer
}

// New returns a Store on table through client (usually a
// *dynamodb.Client).
func New(client DynamoDBAPI, table string, opts ...Option) (*Store, error) {
	if ddbarg.NilClient(client) {
		return nil, idemrecord.Invalid("client is nil")
	}
	if err := ddbarg.Table("table", table); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.now == nil {
		return nil, idemrecord.Invalid("clock is nil")
	}
	if err := validKeyAttrs(cfg.pk, cfg.sk); err != nil {
		return nil, err
	}
	return &Store{
		client: client, table: table, pk: cfg.pk, sk: cfg.sk, retention: cfg.retention, wait: cfg.wait,
		policy: backoff.Policy{Base: 5 * time.Millisecond, Cap: 200 * time.Millisecond}, now: cfg.now,
		log: idemrecord.Logger(cfg.log), obs: cfg.obs,
	}, nil
}

// The record's attributes.
const (
	attrFingerprint = "fingerprint"
	attrResult      = "result"
	attrTerminal    = "terminal"
	attrCreated     = "created_ms"
	attrExpires     = "expires_ms"
	attrTTL         = "ttl"
)

// validKeyAttrs checks WithKeyAttributes' names: a partition key name, and
// a sort key name if any, distinct from each other and from the record's
// own attributes.
func validKeyAttrs(pk, sk string) error {
	if err := ddbarg.KeyAttributes(pk, sk, attrFingerprint, attrResult, attrTerminal, attrCreated, attrExpires, attrTTL); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// itemKey is the record's primary key.
func (d *Store) itemKey(scope, key string) map[string]types.AttributeValue {
	k := map[string]types.AttributeValue{
		d.pk: &types.AttributeValueMemberS{Value: "nolock-idem/" + strconv.Itoa(len(scope)) + "/" + scope + "/" + key},
	}
	if d.sk != "" {
		k[d.sk] = &types.AttributeValueMemberS{Value: SortKeyValue}
	}
	return k
}

// errConflict means the transaction met a concurrent one: try again.
var errConflict = errors.New("idempotency: transaction conflict")

// Do is idempotency.Store.Do on DynamoDB: at most one effect per (scope, key). It reads
// the key's record (consistently): a live one is replayed (Replayed) or
// refused (*MismatchError); otherwise it calls fn and writes fn's writes
// with the record in one TransactWriteItems, whose condition on the record
// (absent or expired) makes exactly one of concurrent duplicates commit;
// the others read its record and replay it. A function error stores
// nothing unless marked Terminal; a Terminal outcome is written with fn's
// writes and replayed like a success. ErrInProgress means the transaction
// kept meeting concurrent ones until the wait ran out; ErrAmbiguousCommit
// means the request may have committed (a lost reply, a timeout, a server
// error): call Do again with the same key to learn which. Bad arguments
// are ErrInvalid before any I/O, as for idempotency.Store.Do.
func (d *Store) Do(ctx context.Context, scope, key string, fingerprint []byte, fn Func) (Result, error) {
	ctx, c := idemrecord.Start(d.obs, ctx, CallDo, key)
	defer c.Unwound()
	res, err := d.do(ctx, scope, key, fingerprint, fn)
	idemrecord.LogOutcome(ctx, d.log, key, d.policy.Attempts, res.Replayed, err)
	c.Observe(res.Replayed, err)
	return res, err
}

func (d *Store) do(ctx context.Context, scope, key string, fingerprint []byte, fn Func) (Result, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return Result{}, err
	}
	if err := idemrecord.ValidRequest(scope, key, fingerprint, fn == nil); err != nil {
		return Result{}, err
	}
	if fingerprint == nil {
		fingerprint = []byte{}
	}
	start := time.Now()
	onRetry := idemrecord.RetryLogger(ctx, d.log, key)
	for attempt := 1; ; attempt++ {
		res, err := d.once(ctx, scope, key, fingerprint, fn)
		if !errors.Is(err, errConflict) {
			return res, err
		}
		if d.wait > 0 && time.Since(start) > d.wait {
			return Result{}, errfmt.Errorf("%w: key %q: %w", ErrInProgress, key, err)
		}
		delay := d.policy.Delay(attempt + 1)
		if onRetry != nil {
			onRetry(attempt, err, delay)
		}
		if err := backoff.Sleep(ctx, delay); err != nil {
			return Result{}, errfmt.Errorf("%w: key %q: %w", ErrInProgress, key, err)
		}
	}
}

func (d *Store) once(ctx context.Context, scope, key string, fp []byte, fn Func) (Result, error) {
	now := d.now()
	stored, found, err := d.get(ctx, scope, key)
	if err != nil {
		return Result{}, err
	}
	if found && stored.ExpiresAt.After(now) {
		return replayOf(stored, fp)
	}
	writes, body, ferr := fn(ctx)
	terminal := ferr != nil && idemrecord.IsTerminal(ferr)
	if ferr != nil && !terminal {
		return Result{}, ferr
	}
	if len(writes) > 99 {
		return Result{}, idemrecord.Invalid("fn returned %d writes, more than 99", len(writes))
	}
	rec := Record{Scope: scope, Key: key, Fingerprint: fp, Body: body, Terminal: terminal,
		CreatedAt: now.Truncate(time.Millisecond), ExpiresAt: now.Add(d.retention).Truncate(time.Millisecond)}
	item := d.itemKey(scope, key)
	item[attrFingerprint] = &types.AttributeValueMemberB{Value: fp}
	item[attrTerminal] = &types.AttributeValueMemberBOOL{Value: terminal}
	item[attrCreated] = millis(rec.CreatedAt)
	item[attrExpires] = millis(rec.ExpiresAt)
	item[attrTTL] = &types.AttributeValueMemberN{Value: strconv.FormatInt(rec.ExpiresAt.Unix()+1, 10)}
	if body != nil {
		item[attrResult] = &types.AttributeValueMemberB{Value: body}
	}
	put := types.TransactWriteItem{Put: &types.Put{
		TableName:                 aws.String(d.table),
		Item:                      item,
		ConditionExpression:       aws.String("attribute_not_exists(#pk) OR #exp <= :now"),
		ExpressionAttributeNames:  map[string]string{"#pk": d.pk, "#exp": attrExpires},
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": millis(now)},
	}}
	// The SDK may retry only an attempt that changed nothing: a retry after a
	// lost reply could end in a throttle that hides the first commit.
	_, err = d.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: append(append([]types.TransactWriteItem(nil), writes...), put),
	}, ddberr.NoBlindRetries)
	var canceled *types.TransactionCanceledException
	switch {
	case err == nil:
		return Result{Record: rec}, nil
	case errors.As(err, &canceled):
		// Try again (and so read the record) if the transaction met a
		// concurrent one, or if the record's own condition failed: another
		// request stored it first. A server that gives no reasons: try
		// again if a record is there now.
		again := false
		for i, r := range canceled.CancellationReasons {
			code := aws.ToString(r.Code)
			again = again || code == "TransactionConflict" || code == "ConditionalCheckFailed" && i == len(writes)
		}
		if !again && len(canceled.CancellationReasons) == 0 {
			_, again, _ = d.get(ctx, scope, key)
		}
		if again {
			return Result{}, errfmt.Errorf("%w: %w", errConflict, err)
		}
		return Result{}, errfmt.Errorf("idempotency: key %q: transaction canceled, nothing written: %w", key, err)
	case ddberr.NotApplied(err):
		return Result{}, errfmt.Errorf("idempotency: key %q: %w", key, err)
	default:
		return Result{}, errfmt.Errorf("%w: key %q: %w", ErrAmbiguousCommit, key, err)
	}
}

// Get returns the live record of (scope, key), or ErrNotFound (judged by
// this process's clock).
func (d *Store) Get(ctx context.Context, scope, key string) (Record, error) {
	if err := idemrecord.CheckCtx(ctx); err != nil {
		return Record{}, err
	}
	if err := idemrecord.ValidKey(scope, key); err != nil {
		return Record{}, err
	}
	rec, found, err := d.get(ctx, scope, key)
	if err != nil {
		return Record{}, err
	}
	if !found || !rec.ExpiresAt.After(d.now()) {
		return Record{}, ErrNotFound
	}
	return rec, nil
}

// get reads the record, expired or not, consistently.
func (d *Store) get(ctx context.Context, scope, key string) (Record, bool, error) {
	out, err := d.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(d.table), Key: d.itemKey(scope, key), ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Record{}, false, errfmt.Errorf("idempotency: get %q: %w", key, err)
	}
	if out.Item == nil {
		return Record{}, false, nil
	}
	rec := Record{Scope: scope, Key: key}
	var created, expires int64
	fp, ok1 := out.Item[attrFingerprint].(*types.AttributeValueMemberB)
	term, ok2 := out.Item[attrTerminal].(*types.AttributeValueMemberBOOL)
	c, ok3 := out.Item[attrCreated].(*types.AttributeValueMemberN)
	e, ok4 := out.Item[attrExpires].(*types.AttributeValueMemberN)
	if ok3 && ok4 {
		var err1, err2 error
		created, err1 = strconv.ParseInt(c.Value, 10, 64)
		expires, err2 = strconv.ParseInt(e.Value, 10, 64)
		ok3, ok4 = err1 == nil, err2 == nil
	}
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return Record{}, false, errfmt.Errorf("idempotency: get %q: malformed record %v", key, out.Item)
	}
	rec.Fingerprint, rec.Terminal = fp.Value, term.Value
	rec.CreatedAt, rec.ExpiresAt = time.UnixMilli(created), time.UnixMilli(expires)
	if r, ok := out.Item[attrResult].(*types.AttributeValueMemberB); ok {
		rec.Body = r.Value
	}
	return rec, true, nil
}

func millis(t time.Time) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(t.UnixMilli(), 10)}
}
