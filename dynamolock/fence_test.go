package dynamolock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

func docKey(name string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: name}}
}

func readDoc(t *testing.T, api interface {
	GetItem(context.Context, *dynamodb.GetItemInput, ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
}, table, name string) (body, fence string) {
	t.Helper()
	out, err := api.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table), Key: docKey(name), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return attrS(out.Item, "body"), attrN(out.Item, "fence")
}

// A lock's token fences writes to the caller's own DynamoDB items through
// dynamoconditional.Fenced, the one fence for DynamoDB items: the newer
// holder's token is stored with its write, and the older holder's fenced
// update, put and Update are refused, while an unfenced write from it
// lands.
func TestFenceDynamoDBWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	c := newClient(t, api, table)
	old := mustAcquire(t, c, "lock")
	old.Close()
	cur := mustAcquire(t, c, "lock")
	defer cur.Close()
	docs, err := dynamoconditional.NewFenced(table, "pk", "fence")
	if err != nil {
		t.Fatal(err)
	}

	update := func(l *dynamolock.Lock, body string) error {
		in := &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: docKey("doc"),
			UpdateExpression:          aws.String("SET #b = :b REMOVE #gone"),
			ExpressionAttributeNames:  map[string]string{"#b": "body", "#gone": "gone"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":b": &types.AttributeValueMemberS{Value: body}},
		}
		if err := docs.ApplyUpdate(in, l.Token()); err != nil {
			t.Fatal(err)
		}
		_, err = api.UpdateItem(ctx, in)
		return err
	}
	put := func(l *dynamolock.Lock, body string) error {
		in := &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "doc"}, "body": &types.AttributeValueMemberS{Value: body}}}
		if err := docs.ApplyPut(in, l.Token()); err != nil {
			t.Fatal(err)
		}
		_, err = api.PutItem(ctx, in)
		return err
	}
	set := func(l *dynamolock.Lock, body string) error {
		return docs.Update(ctx, api, docKey("doc"), l.Token(), map[string]types.AttributeValue{"body": &types.AttributeValueMemberS{Value: body}})
	}
	if err := update(cur, "current holder"); err != nil {
		t.Fatal(err)
	}
	var ccf *types.ConditionalCheckFailedException
	if err := update(old, "stale update"); !errors.As(err, &ccf) {
		t.Fatalf("stale fenced update: %v; want a failed condition", err)
	}
	if err := put(old, "stale put"); !errors.As(err, &ccf) {
		t.Fatalf("stale fenced put: %v; want a failed condition", err)
	}
	if err := set(old, "stale set"); !errors.Is(err, dynamoconditional.ErrFenced) {
		t.Fatalf("stale Update: %v; want ErrFenced", err)
	}
	if body, fence := readDoc(t, api, table, "doc"); body != "current holder" || fence != "2" {
		t.Fatalf("doc %q at fence %s; want the current holder's at 2", body, fence)
	}
	if err := put(cur, "current holder again"); err != nil {
		t.Fatalf("equal token: %v", err)
	}
	if err := set(cur, "current holder's Update"); err != nil {
		t.Fatalf("equal token, Update: %v", err)
	}
	// Without the fence, the stale holder's write lands.
	if _, err := api.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "doc"}, "body": &types.AttributeValueMemberS{Value: "stale unfenced"}}}); err != nil {
		t.Fatal(err)
	}
	if body, _ := readDoc(t, api, table, "doc"); body != "stale unfenced" {
		t.Fatalf("doc %q", body)
	}
	if err := docs.ApplyUpdate(&dynamodb.UpdateItemInput{Key: docKey("doc")}, -1); !errors.Is(err, dynamoconditional.ErrInvalid) {
		t.Fatalf("negative token: %v", err)
	}
	clash := &dynamodb.UpdateItemInput{Key: docKey("doc"), ExpressionAttributeNames: map[string]string{"#nolockFence": "x"}}
	if err := docs.ApplyUpdate(clash, 1); !errors.Is(err, dynamoconditional.ErrInvalid) {
		t.Fatalf("placeholder clash: %v", err)
	}
}

// On a server with transactions: writes put into a transaction with the
// lock's ConditionCheck apply while the lock has not changed hands, and are
// refused with ErrFenced, applying nothing, once a newer holder has taken
// the lock over from a holder that was cut off.
func TestTransactConditionCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testenv.DynamoDBTx(t)
	table := testenv.Table(t, server, false)
	cut := &faulty{DynamoDBAPI: server}
	a := newClient(t, cut, table)
	b := newClient(t, server, table)
	put := func(body string) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "doc"}, "body": &types.AttributeValueMemberS{Value: body}}}}
	}
	la := mustAcquire(t, a, "lock")
	if err := la.Transact(ctx, server, put("a")); err != nil {
		t.Fatalf("holder's transaction: %v", err)
	}
	cut.blackhole.Store(true)                        // a's heartbeats stop landing
	t.Cleanup(func() { cut.blackhole.Store(false) }) // before a's Close
	start := time.Now()
	lb := mustAcquire(t, b, "lock")
	defer lb.Close()
	// b first saw a's last version after start, and waited a lease. Its
	// token is a's + 1, or more if a takeover's answer came after a lease
	// (a busy server) and b wrote again.
	if took := time.Since(start); took < testLease || lb.Token() <= la.Token() {
		t.Fatalf("b took over after %v with token %d; want at least a lease (%v) and a token above %d", took, lb.Token(), testLease, la.Token())
	}
	if err := lb.Transact(ctx, server, put("b")); err != nil {
		t.Fatalf("new holder's transaction: %v", err)
	}
	if err := la.Transact(ctx, server, put("stale a")); !errors.Is(err, dynamolock.ErrFenced) {
		t.Fatalf("stale holder's transaction: %v; want ErrFenced", err)
	}
	if body, _ := readDoc(t, server, table, "doc"); body != "b" {
		t.Fatalf("doc %q; want b's", body)
	}
}

// Where the server returns the item with a failed condition (DynamoDB,
// moto), a refused TryAcquire costs one call: no read.
func TestReturnedItemSavesRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testenv.DynamoDBTx(t)
	table := testenv.Table(t, server, false)
	holder := newClient(t, server, table, dynamolock.WithOwner("holder"))
	l := mustAcquire(t, holder, "k")
	defer l.Close()
	// A write cut off at its bound (a server too busy to answer within a
	// lease) is read back: that trial says nothing, and the next one runs.
	for trial := 1; ; trial++ {
		api := &counting{DynamoDBAPI: server}
		waiter := newClient(t, api, table)
		_, err := waiter.TryAcquire(ctx, "k")
		var held *dynamolock.HeldError
		if !errors.As(err, &held) || held.Owner != "holder" {
			t.Fatalf("TryAcquire: %v", err)
		}
		if w := api.recorded("acquire"); len(w) == 1 && errors.Is(w[0].err, context.DeadlineExceeded) && trial < 5 {
			t.Logf("trial %d: the write was cut off after %v", trial, w[0].done.Sub(w[0].sent))
			continue
		}
		if api.updates.Load() != 1 || api.gets.Load() != 0 {
			t.Fatalf("%d updates, %d gets; want 1 update and no read", api.updates.Load(), api.gets.Load())
		}
		return
	}
}
