package dynamoidempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// initial is alice's balance when a test starts.
const initial = 10_000

// errInsufficient is the terminal refusal of a payment alice cannot cover.
var errInsufficient = errors.New("insufficient funds")

// fingerprint identifies a payment request.
func fingerprint(account, payment string, amount int64) []byte {
	return dynamoidempotency.Fingerprint([]byte(account), []byte(payment), []byte(strconv.FormatInt(amount, 10)))
}

// dynamoBed is the wallet on DynamoDB (the transactions server): a wallet
// item "wallet/alice" and one ledger item per payment, in the test's table.
type dynamoBed struct {
	t      *testing.T
	client *dynamodb.Client
	table  string
	store  *dynamoidempotency.Store
	calls  atomic.Int64
}

func newDynamoBed(t *testing.T, wrap func(dynamoidempotency.DynamoDBAPI) dynamoidempotency.DynamoDBAPI, opts ...dynamoidempotency.Option) *dynamoBed {
	t.Helper()
	client := testenv.DynamoDBTx(t)
	b := &dynamoBed{t: t, client: client, table: testenv.Table(t, client, false)}
	var api dynamoidempotency.DynamoDBAPI = client
	if wrap != nil {
		api = wrap(client)
	}
	store, err := dynamoidempotency.New(api, b.table, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b.store = store
	b.put("wallet/alice", initial)
	return b
}

func s(v string) *types.AttributeValueMemberS { return &types.AttributeValueMemberS{Value: v} }
func n(v int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(v, 10)}
}

func (b *dynamoBed) put(pk string, amount int64) {
	b.t.Helper()
	_, err := b.client.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(b.table),
		Item: map[string]types.AttributeValue{"pk": s(pk), "amount": n(amount)}})
	if err != nil {
		b.t.Fatal(err)
	}
}

// amount reads the item's amount; -1 when there is no item.
func (b *dynamoBed) amount(pk string) int64 {
	b.t.Helper()
	out, err := b.client.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(b.table),
		Key: map[string]types.AttributeValue{"pk": s(pk)}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		b.t.Fatal(err)
	}
	if out.Item == nil {
		return -1
	}
	v, err := strconv.ParseInt(out.Item["amount"].(*types.AttributeValueMemberN).Value, 10, 64)
	if err != nil {
		b.t.Fatal(err)
	}
	return v
}

// pay debits alice and writes the payment's ledger item, both conditional,
// in Do's transaction. A balance short of the amount is declined, a
// terminal outcome; the debit's own condition guards the race between the
// read and the write.
func (b *dynamoBed) pay(payment string, amount int64) dynamoidempotency.Func {
	return func(ctx context.Context) ([]types.TransactWriteItem, []byte, error) {
		b.calls.Add(1)
		if b.amount("wallet/alice") < amount {
			return nil, []byte("declined"), dynamoidempotency.Terminal(errInsufficient)
		}
		return []types.TransactWriteItem{
			{Update: &types.Update{TableName: aws.String(b.table), Key: map[string]types.AttributeValue{"pk": s("wallet/alice")},
				UpdateExpression:          aws.String("SET amount = amount - :a"),
				ConditionExpression:       aws.String("amount >= :a"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":a": n(amount)}}},
			{Put: &types.Put{TableName: aws.String(b.table), Item: map[string]types.AttributeValue{"pk": s("ledger/" + payment), "amount": n(amount)},
				ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		}, []byte(fmt.Sprintf("paid %s %d", payment, amount)), nil
	}
}

func (b *dynamoBed) payOnce(ctx context.Context, payment string, amount int64) (dynamoidempotency.Result, error) {
	return b.store.Do(ctx, "alice", payment, fingerprint("alice", payment, amount), b.pay(payment, amount))
}

// check asserts the balance and which payments have a ledger item.
func (b *dynamoBed) check(balance int64, payments map[string]int64) {
	b.t.Helper()
	if got := b.amount("wallet/alice"); got != balance {
		b.t.Fatalf("balance %d, want %d", got, balance)
	}
	for p, want := range payments {
		if got := b.amount("ledger/" + p); got != want {
			b.t.Fatalf("ledger item of %s: %d, want %d (-1: none)", p, got, want)
		}
	}
}

func TestDynamoDBRunsOnceThenReplays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newDynamoBed(t, nil)
	first, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || first.Replayed || string(first.Body) != "paid pay-1 500" {
		t.Fatalf("first: %+v, %v", first, err)
	}
	again, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || !again.Replayed || string(again.Body) != "paid pay-1 500" || !again.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("retry: %+v, %v; want a replay of %+v", again, err, first)
	}
	_, err = b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 700), b.pay("pay-1", 700))
	var mm *dynamoidempotency.MismatchError
	if !errors.As(err, &mm) || !errors.Is(err, dynamoidempotency.ErrMismatch) || string(mm.Stored.Body) != "paid pay-1 500" {
		t.Fatalf("same key, other amount: %v, want a *MismatchError with the stored record", err)
	}
	if rec, err := b.store.Get(ctx, "alice", "pay-1"); err != nil || string(rec.Body) != "paid pay-1 500" {
		t.Fatalf("Get: %+v, %v", rec, err)
	}
	if _, err := b.store.Get(ctx, "alice", "pay-2"); !errors.Is(err, dynamoidempotency.ErrNotFound) {
		t.Fatalf("Get of an unused key: %v", err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(initial-500, map[string]int64{"pay-1": 500})
}

// 4 payments, each delivered 3 times at once: duplicates race their
// transactions, exactly one of each commits, the others replay it.
func TestDynamoDBConcurrentRetriesTakeEffectOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newDynamoBed(t, nil, dynamoidempotency.WithWait(20*time.Second))
	const payments, deliveries, amount = 4, 3, 300
	var ran, replayed atomic.Int64
	var wg sync.WaitGroup
	for p := 0; p < payments; p++ {
		for d := 0; d < deliveries; d++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := b.payOnce(ctx, fmt.Sprint("pay-", p), amount)
				switch {
				case err != nil:
					t.Error(err)
				case string(res.Body) != fmt.Sprintf("paid pay-%d %d", p, amount):
					t.Errorf("payment %d answered %q", p, res.Body)
				case res.Replayed:
					replayed.Add(1)
				default:
					ran.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if ran.Load() != payments || replayed.Load() != payments*(deliveries-1) {
		t.Fatalf("%d ran, %d replayed; want %d and %d", ran.Load(), replayed.Load(), payments, payments*(deliveries-1))
	}
	ledger := map[string]int64{}
	for p := 0; p < payments; p++ {
		ledger[fmt.Sprint("pay-", p)] = amount
	}
	b.check(initial-payments*amount, ledger)
}

func TestDynamoDBTerminalAndRefusedEffects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newDynamoBed(t, nil)
	res, err := b.payOnce(ctx, "pay-big", initial+1)
	if err != nil || !res.Terminal || string(res.Body) != "declined" {
		t.Fatalf("payment above the balance: %+v, %v; want a stored terminal 'declined'", res, err)
	}
	b.put("wallet/alice", 2*initial) // topped up
	res, err = b.payOnce(ctx, "pay-big", initial+1)
	if err != nil || !res.Replayed || !res.Terminal || string(res.Body) != "declined" {
		t.Fatalf("retry after a top-up: %+v, %v; want the replayed 'declined'", res, err)
	}

	// An effect whose own condition fails cancels the whole transaction:
	// an error, and neither the effect nor the record is written.
	overdraw := func(ctx context.Context) ([]types.TransactWriteItem, []byte, error) {
		writes, body, err := b.pay("pay-x", 3*initial)(ctx)
		if err != nil { // the read said no; skip it to let the condition decide
			writes, body, err = []types.TransactWriteItem{{Update: &types.Update{TableName: aws.String(b.table),
				Key:                       map[string]types.AttributeValue{"pk": s("wallet/alice")},
				UpdateExpression:          aws.String("SET amount = amount - :a"),
				ConditionExpression:       aws.String("amount >= :a"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":a": n(3 * initial)}}}}, []byte("paid"), nil
		}
		return writes, body, err
	}
	_, err = b.store.Do(ctx, "alice", "pay-x", nil, overdraw)
	var canceled *types.TransactionCanceledException
	if !errors.As(err, &canceled) {
		t.Fatalf("effect whose condition fails: %v, want a TransactionCanceledException", err)
	}
	if _, err := b.store.Get(ctx, "alice", "pay-x"); !errors.Is(err, dynamoidempotency.ErrNotFound) {
		t.Fatalf("record after a canceled transaction: %v, want ErrNotFound", err)
	}
	b.check(2*initial, map[string]int64{"pay-big": -1, "pay-x": -1})
}

func TestDynamoDBExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli())
	clock := func() time.Time { return time.UnixMilli(now.Load()) }
	b := newDynamoBed(t, nil, dynamoidempotency.WithRetention(time.Hour), dynamoidempotency.WithClock(clock))
	if _, err := b.payOnce(ctx, "pay-1", 100); err != nil {
		t.Fatal(err)
	}
	now.Add((59 * time.Minute).Milliseconds())
	if res, err := b.payOnce(ctx, "pay-1", 100); err != nil || !res.Replayed {
		t.Fatalf("retry within retention: %+v, %v", res, err)
	}
	now.Add((2 * time.Minute).Milliseconds())
	if _, err := b.store.Get(ctx, "alice", "pay-1"); !errors.Is(err, dynamoidempotency.ErrNotFound) {
		t.Fatalf("Get after expiry: %v, want ErrNotFound", err)
	}
	res, err := b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1b", 200), b.pay("pay-1b", 200))
	if err != nil || res.Replayed {
		t.Fatalf("reuse after expiry: %+v, %v; want a fresh run", res, err)
	}
	b.check(initial-300, map[string]int64{"pay-1": 100, "pay-1b": 200})
}

// lossy delivers TransactWriteItems to the server and then loses the reply
// (commit true), or loses the request (commit false), once.
type lossy struct {
	dynamoidempotency.DynamoDBAPI
	commit bool
	armed  atomic.Bool
}

func (l *lossy) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	if !l.armed.CompareAndSwap(true, false) {
		return l.DynamoDBAPI.TransactWriteItems(ctx, in, opts...)
	}
	if l.commit {
		if _, err := l.DynamoDBAPI.TransactWriteItems(ctx, in, opts...); err != nil {
			return nil, err
		}
	}
	return nil, errors.New("read tcp 127.0.0.1:18001: connection reset by peer")
}

// Fault: the reply of the transaction (or the request itself) is lost.
// Do reports ErrAmbiguousCommit, and a retry with the same key converges
// to one effect: a replay if it committed, a fresh run if it did not.
func TestDynamoDBLostReplyConverges(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprintf("committed=%v", committed), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var l *lossy
			b := newDynamoBed(t, func(api dynamoidempotency.DynamoDBAPI) dynamoidempotency.DynamoDBAPI {
				l = &lossy{DynamoDBAPI: api, commit: committed}
				return l
			})
			l.armed.Store(true)
			if _, err := b.payOnce(ctx, "pay-1", 500); !errors.Is(err, dynamoidempotency.ErrAmbiguousCommit) {
				t.Fatalf("lost reply: %v, want ErrAmbiguousCommit", err)
			}
			res, err := b.payOnce(ctx, "pay-1", 500)
			if err != nil || res.Replayed != committed {
				t.Fatalf("retry: %+v, %v; want Replayed %v", res, err, committed)
			}
			b.check(initial-500, map[string]int64{"pay-1": 500})
		})
	}
}

// noDynamo fails the test on any call.
type noDynamo struct{ t *testing.T }

func (d noDynamo) GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	d.t.Error("GetItem called")
	return nil, errors.New("no I/O")
}

func (d noDynamo) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	d.t.Error("TransactWriteItems called")
	return nil, errors.New("no I/O")
}

func TestDynamoDBBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := dynamoidempotency.New(noDynamo{t}, "tbl")
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context) ([]types.TransactWriteItem, []byte, error) { return nil, nil, nil }
	for _, tc := range []struct {
		key   string
		fn    dynamoidempotency.Func
		names string
	}{{"", fn, "key"}, {string(make([]byte, dynamoidempotency.MaxKeyLen+1)), fn, "key"}, {"k", nil, "fn"}} {
		if _, err := store.Do(ctx, "", tc.key, nil, tc.fn); !errors.Is(err, dynamoidempotency.ErrInvalid) {
			t.Fatalf("Do(%q): %v, want ErrInvalid naming %s", tc.key, err, tc.names)
		}
	}
	for _, opts := range [][]dynamoidempotency.Option{
		{dynamoidempotency.WithRetention(0)}, {dynamoidempotency.WithKeyAttributes("", "")}, {dynamoidempotency.WithClock(nil)},
	} {
		if _, err := dynamoidempotency.New(noDynamo{t}, "tbl", opts...); !errors.Is(err, dynamoidempotency.ErrInvalid) {
			t.Fatalf("New with a bad option: %v, want ErrInvalid", err)
		}
	}
	if _, err := dynamoidempotency.New(noDynamo{t}, ""); !errors.Is(err, dynamoidempotency.ErrInvalid) {
		t.Fatalf("empty table: %v", err)
	}
}
