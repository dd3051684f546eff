package dynamolock_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres, testenv.EnvDynamoDBTx), goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"))
}

// Test settings, stretched by testenv.Scale (4x under -race, more on a
// machine marked slow): a holder keeps its lock through any stall shorter
// than the lease, so the lease must outlast the machine's stalls for the
// tests to check the algorithm rather than the machine's speed.
var (
	testLease = testenv.Scale(600 * time.Millisecond).Round(time.Millisecond)
	testPoll  = testenv.Scale(20 * time.Millisecond)
)

// newTable returns a client of the default DynamoDB test server and a fresh
// table whose partition key is pk.
func newTable(t testing.TB) (*dynamodb.Client, string) {
	t.Helper()
	client := testenv.DynamoDB(t)
	return client, testenv.Table(t, client, false)
}

// clientFor returns a DynamoDB client of endpoint (a proxy's, or a private
// server's) whose idle connections are closed when the test ends.
func clientFor(t testing.TB, endpoint string) *dynamodb.Client {
	tr := services.DynamoDBTransport()
	t.Cleanup(tr.CloseIdleConnections)
	return services.DynamoDBClient(endpoint, &http.Client{Transport: services.OwnBody(tr)})
}

// newClient returns a dynamolock.Client on table with the test defaults
// (partition key pk, lease testLease, poll testPoll) before opts, closed
// when the test ends.
func newClient(t testing.TB, api dynamolock.DynamoDBAPI, table string, opts ...dynamolock.Option) *dynamolock.Client {
	t.Helper()
	base := []dynamolock.Option{dynamolock.WithKeyAttributes("pk", ""), dynamolock.WithLease(testLease), dynamolock.WithPoll(testPoll)}
	c, err := dynamolock.New(api, table, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// unanswered reports whether err is a lock's expiry with a heartbeat
// unanswered within the lease: the loss a server too busy to answer
// causes, which breaks a test's precondition, not the lock's promise.
func unanswered(err error) bool {
	var lost *dynamolock.LostError
	return errors.As(err, &lost) && lost.Cause == dynamolock.Expired && errors.Is(err, context.DeadlineExceeded)
}

func mustAcquire(t testing.TB, c *dynamolock.Client, key string, opts ...dynamolock.AcquireOption) *dynamolock.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
	defer cancel()
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("acquire %q: %v", key, err)
	}
	return l
}

// readItem reads the lock item key consistently (nil if absent).
func readItem(t testing.TB, api dynamolock.DynamoDBAPI, table, key string) map[string]types.AttributeValue {
	t.Helper()
	out, err := api.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: key}}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Item
}

func attrS(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func attrN(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitClosed waits up to d for ch to close.
func waitClosed(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// counting counts the calls that reach DynamoDB and records every
// UpdateItem (see write). Its hooks, set when it is made, see each
// UpdateItem: before as it is passed on, after with its answer, before the
// caller does.
type counting struct {
	dynamolock.DynamoDBAPI
	gets, updates, deletes atomic.Int64
	before                 func(op string)
	after                  func(op string, err error)

	mu     sync.Mutex
	writes []write
}

// write is one UpdateItem as a wrapper saw it: the lock operation (see op),
// the key, when the caller handed it over and when its answer came back,
// and the error, if any.
type write struct {
	op, key    string
	sent, done time.Time
	err        error
}

func (c *counting) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	c.gets.Add(1)
	return c.DynamoDBAPI.GetItem(ctx, in, o...)
}

func (c *counting) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.updates.Add(1)
	w := write{op: op(in), key: attrS(in.Key, "pk"), sent: time.Now()}
	if c.before != nil {
		c.before(w.op)
	}
	out, err := c.DynamoDBAPI.UpdateItem(ctx, in, o...)
	w.done, w.err = time.Now(), err
	c.mu.Lock()
	c.writes = append(c.writes, w)
	c.mu.Unlock()
	if c.after != nil {
		c.after(w.op, err)
	}
	return out, err
}

func (c *counting) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	c.deletes.Add(1)
	return c.DynamoDBAPI.DeleteItem(ctx, in, o...)
}

func (c *counting) total() int64 { return c.gets.Load() + c.updates.Load() + c.deletes.Load() }

// recorded returns the UpdateItems of the operation op (all if op is ""),
// in the order their answers came back.
func (c *counting) recorded(op string) []write {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []write
	for _, w := range c.writes {
		if op == "" || w.op == op {
			out = append(out, w)
		}
	}
	return out
}

// succeeded counts the UpdateItems of op that were answered without error.
func (c *counting) succeeded(op string) int {
	n := 0
	for _, w := range c.recorded(op) {
		if w.err == nil {
			n++
		}
	}
	return n
}

// errInjected is the error a faulty client returns for a lost request or
// response: like a timeout, it says nothing about whether the write applied.
var errInjected = errors.New("injected fault: no answer")

// fault is what a faulty client does with one call.
type fault int

const (
	pass         fault = iota
	dropRequest        // never sent; errInjected
	dropResponse       // sent and applied; errInjected instead of the answer
	sdkRetry           // sent twice (as an SDK retry would); the second answer
	throttle           // never sent; errThrottled
)

// errThrottled is DynamoDB's answer to a throttled request, as the SDK
// returns it once its own retries are spent: a 400 that changed nothing.
var errThrottled error = &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem",
	Err: &awshttp.ResponseError{ResponseError: &smithyhttp.ResponseError{
		Response: &smithyhttp.Response{Response: &http.Response{StatusCode: http.StatusBadRequest}},
		Err:      &types.ProvisionedThroughputExceededException{Message: aws.String("injected throttle")},
	}}}

// op names a lock write by its update expression.
func op(in *dynamodb.UpdateItemInput) string {
	switch u := aws.ToString(in.UpdateExpression); {
	case strings.HasPrefix(u, "SET #own"):
		return "acquire"
	case strings.HasPrefix(u, "SET #rvn"):
		return "heartbeat"
	case strings.HasPrefix(u, "SET #rel"):
		return "release"
	}
	return "other"
}

// faulty injects faults into UpdateItem calls, chosen by rule (op is
// acquire, heartbeat, release or other; injected counts the faults it
// applied); reads pass, or fail while blackhole is set, as does every call.
type faulty struct {
	dynamolock.DynamoDBAPI
	mu        sync.Mutex
	rule      func(op string) fault
	blackhole atomic.Bool
	injected  atomic.Int64
}

func (f *faulty) setRule(r func(op string) fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule = r
}

func (f *faulty) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if f.blackhole.Load() {
		return nil, errInjected
	}
	return f.DynamoDBAPI.GetItem(ctx, in, o...)
}

func (f *faulty) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if f.blackhole.Load() {
		return nil, errInjected
	}
	return f.DynamoDBAPI.DeleteItem(ctx, in, o...)
}

func (f *faulty) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if f.blackhole.Load() {
		return nil, errInjected
	}
	f.mu.Lock()
	what := pass
	if f.rule != nil {
		what = f.rule(op(in))
	}
	f.mu.Unlock()
	if what != pass {
		f.injected.Add(1)
	}
	switch what {
	case dropRequest:
		return nil, errInjected
	case throttle:
		return nil, errThrottled
	case dropResponse:
		if _, err := f.DynamoDBAPI.UpdateItem(context.Background(), in, o...); err != nil {
			return nil, err
		}
		return nil, errInjected
	case sdkRetry:
		if _, err := f.DynamoDBAPI.UpdateItem(context.Background(), in, o...); err != nil {
			return nil, err
		}
	}
	return f.DynamoDBAPI.UpdateItem(ctx, in, o...)
}

// times returns a rule that applies what to the first n calls of op, and
// passes every other call.
func times(target string, n int, what fault) func(string) fault {
	var seen int
	return func(o string) fault {
		if o != target || seen >= n {
			return pass
		}
		seen++
		return what
	}
}
