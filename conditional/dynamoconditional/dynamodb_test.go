package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// dynamoServer names a DynamoDB-compatible test server: dynalite (no
// transactions, no item on a failed condition) or moto (both).
type dynamoServer struct {
	name string
	tx   bool
}

var dynamoServers = []dynamoServer{{"dynalite", false}, {"moto", true}}

// dynamoClient returns a client for the transactions server (tx) or the
// default one, on an HTTP transport of its own whose idle connections are
// closed when the test ends, so no keep-alive goroutine outlives the test.
// Request bodies go through services.OwnBody (see there).
func dynamoClient(t *testing.T, tx bool) *dynamodb.Client {
	t.Helper()
	return dynamoClientVia(t, tx, nil)
}

// dynamoClientVia is dynamoClient whose requests pass through wrap.
func dynamoClientVia(t *testing.T, tx bool, wrap func(http.RoundTripper) http.RoundTripper) *dynamodb.Client {
	t.Helper()
	base := testenv.DynamoDB
	if tx {
		base = testenv.DynamoDBTx
	}
	opts := base(t).Options()
	tr := services.DynamoDBTransport()
	t.Cleanup(tr.CloseIdleConnections)
	rt := services.OwnBody(tr)
	if wrap != nil {
		rt = wrap(rt)
	}
	opts.HTTPClient = &http.Client{Transport: rt}
	return dynamodb.New(opts)
}

// dynamoFaults wraps a client: it counts calls, and when dropEvery > 0 it
// drops the answer of every dropEvery-th UpdateItem that applied, returning
// a connection reset instead, as if the connection died after the server
// wrote.
type dynamoFaults struct {
	dynamoconditional.DynamoDBAPI
	dropEvery      int64
	unprocessEvery int64 // see BatchGetItem

	calls, reads, transactions, cancelled, applied, dropped, unprocessed atomic.Int64
}

func (f *dynamoFaults) GetItem(ctx context.Context, in *dynamodb.GetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	f.calls.Add(1)
	f.reads.Add(1)
	return f.DynamoDBAPI.GetItem(ctx, in, opts...)
}

// BatchGetItem counts as one read; with unprocessEvery > 0 it sends only
// every key but the last of each unprocessEvery-th call, and answers that
// last one as unprocessed, as DynamoDB does when it throttles a read.
func (f *dynamoFaults) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	n := f.calls.Add(1)
	f.reads.Add(1)
	var held map[string]types.KeysAndAttributes
	if f.unprocessEvery > 0 && n%f.unprocessEvery == 0 {
		sent, kept := map[string]types.KeysAndAttributes{}, map[string]types.KeysAndAttributes{}
		for table, ka := range in.RequestItems {
			if len(ka.Keys) < 2 {
				sent[table] = ka
				continue
			}
			last := ka
			ka.Keys, last.Keys = ka.Keys[:len(ka.Keys)-1], ka.Keys[len(ka.Keys)-1:]
			sent[table], kept[table] = ka, last
		}
		in = &dynamodb.BatchGetItemInput{RequestItems: sent}
		held = kept
	}
	out, err := f.DynamoDBAPI.BatchGetItem(ctx, in, opts...)
	if err == nil && len(held) > 0 {
		f.unprocessed.Add(1)
		out.UnprocessedKeys = held
	}
	return out, err
}

func (f *dynamoFaults) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, opts ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	f.calls.Add(1)
	out, err := f.DynamoDBAPI.UpdateItem(ctx, in, opts...)
	if err == nil && f.dropEvery > 0 && f.applied.Add(1)%f.dropEvery == 0 {
		f.dropped.Add(1)
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return out, err
}

func (f *dynamoFaults) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	f.calls.Add(1)
	f.transactions.Add(1)
	out, err := f.DynamoDBAPI.TransactWriteItems(ctx, in, opts...)
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		f.cancelled.Add(1)
	}
	return out, err
}

// dynamoRun runs op(w) for w in [0, workers) concurrently and fails the
// test with the first error any returned.
func dynamoRun(t *testing.T, workers int, op func(w int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := op(w); err != nil {
				errs <- fmt.Errorf("worker %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// dynamoItem reads an item by its pk with a consistent read; nil if none.
func dynamoItem(t *testing.T, client *dynamodb.Client, table, pk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Item) == 0 {
		return nil
	}
	return out.Item
}

// dynamoCount returns the number of items in table.
func dynamoCount(t *testing.T, client *dynamodb.Client, table string) int32 {
	t.Helper()
	out, err := client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	return out.Count
}

// The "answer lost after the write applied" fault, injected by a wrapping
// client: the caller is told ErrAmbiguousCommit, never success or a
// refusal, and counting the ambiguous takes conserves the units.
func TestDynamoDroppedAnswerIsAmbiguous(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("buyers", func(t *testing.T) {
		t.Parallel()
		client := dynamoClient(t, false)
		faults := &dynamoFaults{DynamoDBAPI: client, dropEvery: 4}
		s := newDynamoStock(t, faults, testenv.Table(t, client, false), 1)
		const units = 60
		if err := s.Put(ctx, "hot", units); err != nil {
			t.Fatal(err)
		}
		faults.applied.Store(0) // count takes only
		var sold, ambiguous atomic.Int64
		dynamoRun(t, 8, func(int) error {
			for {
				switch err := s.Take(ctx, "hot", 1); {
				case err == nil:
					sold.Add(1)
				case errors.Is(err, dynamoconditional.ErrAmbiguousCommit):
					ambiguous.Add(1)
				case errors.Is(err, dynamoconditional.ErrSoldOut):
					return nil
				default:
					return err
				}
				if sold.Load()+ambiguous.Load() > units {
					return fmt.Errorf("oversold: %d sold and %d ambiguous of %d", sold.Load(), ambiguous.Load(), units)
				}
			}
		})
		left := dynamoAvailable(t, s, "hot")
		t.Logf("sold %d, ambiguous %d, left %d", sold.Load(), ambiguous.Load(), left)
		// A dropped answer leaves every take its write carried ambiguous
		// (coalesced, a write carries several); the sum below checks that
		// each of them did apply.
		if faults.dropped.Load() == 0 || ambiguous.Load() < faults.dropped.Load() {
			t.Errorf("%d takes reported ambiguous, %d answers dropped: want at least one take per dropped answer, and a drop", ambiguous.Load(), faults.dropped.Load())
		}
		if sold.Load()+ambiguous.Load()+left != units || left != 0 {
			t.Errorf("sold %d + ambiguous %d + left %d != %d, or units left", sold.Load(), ambiguous.Load(), left, units)
		}
	})

	t.Run("last unit", func(t *testing.T) {
		t.Parallel()
		client := dynamoClient(t, false)
		faults := &dynamoFaults{DynamoDBAPI: client}
		s := newDynamoStock(t, faults, testenv.Table(t, client, false), 1)
		if err := s.Put(ctx, "last", 1); err != nil {
			t.Fatal(err)
		}
		faults.dropEvery = 1
		if err := s.Take(ctx, "last", 1); !errors.Is(err, dynamoconditional.ErrAmbiguousCommit) {
			t.Fatalf("take whose answer was lost: %v, want ErrAmbiguousCommit", err)
		}
		if got := dynamoAvailable(t, s, "last"); got != 0 {
			t.Fatalf("available %d, want 0: the lost take applied", got)
		}
		if err := s.Take(ctx, "last", 1); !errors.Is(err, dynamoconditional.ErrSoldOut) {
			t.Fatalf("next take: %v, want ErrSoldOut", err)
		}
	})

	t.Run("debit and fenced write", func(t *testing.T) {
		t.Parallel()
		client := dynamoClient(t, false)
		table := testenv.Table(t, client, false)
		faults := &dynamoFaults{DynamoDBAPI: client}
		a := newDynamoAccounts(t, faults, table)
		if err := a.Open(ctx, "alice", 100); err != nil {
			t.Fatal(err)
		}
		faults.dropEvery = 1
		if err := a.Debit(ctx, "alice", 30); !errors.Is(err, dynamoconditional.ErrAmbiguousCommit) {
			t.Fatalf("debit whose answer was lost: %v, want ErrAmbiguousCommit", err)
		}
		if got := dynamoBalance(t, a, "alice"); got != 70 {
			t.Fatalf("balance %d, want 70: the lost debit applied once", got)
		}
		// A fenced write is idempotent: retrying the ambiguous one is safe.
		f := newDynamoDocs(t, client, table)
		doc := dynamoDocKey("doc")
		if err := f.Update(ctx, faults, doc, 3, dynamoBody("v3")); !errors.Is(err, dynamoconditional.ErrAmbiguousCommit) {
			t.Fatalf("fenced write whose answer was lost: %v, want ErrAmbiguousCommit", err)
		}
		faults.dropEvery = 0
		if err := f.Update(ctx, faults, doc, 3, dynamoBody("v3")); err != nil {
			t.Fatalf("retry with the same token: %v", err)
		}
		if d := readDynamoDoc(t, client, table, "doc"); d.body != "v3" || d.fence != 3 {
			t.Fatalf("doc %+v, want v3 at 3", d)
		}
	})
}

// dropAnswers is an HTTP transport that lets an UpdateItem reach the
// server and then, while armed, loses its answer: the SDK sees a connection
// reset, which its default retryer retries.
type dropAnswers struct {
	next           http.RoundTripper
	armed, updates atomic.Int64
}

func (d *dropAnswers) RoundTrip(req *http.Request) (*http.Response, error) {
	update := strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".UpdateItem")
	if update {
		d.updates.Add(1)
	}
	resp, err := d.next.RoundTrip(req)
	if err == nil && update && resp.StatusCode == http.StatusOK && d.armed.Add(-1) >= 0 {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return resp, err
}

// The same fault at the HTTP layer, under the SDK's default retryer: the
// SDK itself would send the decrement again (the control shows it does,
// and misreports the caller's own unit as a failed condition); the
// library's writes are not retried blindly, so the caller is told the
// outcome is unknown and exactly one unit is gone.
func TestDynamoSDKDoesNotRetryALostWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	drop := &dropAnswers{}
	drop.armed.Store(-1 << 40)
	client := dynamoClientVia(t, false, func(next http.RoundTripper) http.RoundTripper { drop.next = next; return drop })
	table := testenv.Table(t, client, false)
	s := newDynamoStock(t, client, table, 1)

	// Control: a bare conditional decrement of the last unit, retried by
	// the SDK after its answer was lost, comes back as a failed condition.
	if err := s.Put(ctx, "control", 1); err != nil {
		t.Fatal(err)
	}
	drop.armed.Store(1)
	drop.updates.Store(0)
	_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "control#0"}},
		UpdateExpression:          aws.String("SET qty = qty - :n"),
		ConditionExpression:       aws.String("qty >= :n"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":n": &types.AttributeValueMemberN{Value: "1"}},
	})
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) || drop.updates.Load() != 2 {
		t.Fatalf("control: bare UpdateItem sent %d times, err %v; want 2 sends and a failed condition", drop.updates.Load(), err)
	}

	for _, units := range []int64{1, 5} {
		key := fmt.Sprintf("sku%d", units)
		if err := s.Put(ctx, key, units); err != nil {
			t.Fatal(err)
		}
		drop.armed.Store(1)
		drop.updates.Store(0)
		if err := s.Take(ctx, key, 1); !errors.Is(err, dynamoconditional.ErrAmbiguousCommit) {
			t.Fatalf("%d units: take whose answer was lost: %v, want ErrAmbiguousCommit", units, err)
		}
		if n := drop.updates.Load(); n != 1 {
			t.Fatalf("%d units: the take was sent %d times, want once", units, n)
		}
		if got := dynamoAvailable(t, s, key); got != units-1 {
			t.Fatalf("%d units: available %d after one lost take, want %d", units, got, units-1)
		}
	}
}

// A write whose connection is refused was never sent: it is returned as
// the dial error, not as ErrAmbiguousCommit, whatever the operation.
func TestDynamoRefusedConnectionIsNotAmbiguous(t *testing.T) {
	t.Parallel()
	refused := testenv.RefusedEndpoint(t)
	ctx := context.Background()
	client := services.DynamoDBClient(refused, nil)
	stock, err := dynamoconditional.NewStock(client, "tbl")
	if err != nil {
		t.Fatal(err)
	}
	accounts, err := dynamoconditional.NewAccounts(client, "tbl")
	if err != nil {
		t.Fatal(err)
	}
	holds, err := dynamoconditional.NewHolds(client, "tbl")
	if err != nil {
		t.Fatal(err)
	}
	fenced, err := dynamoconditional.NewFenced("tbl", "pk", "fence")
	if err != nil {
		t.Fatal(err)
	}
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}
	set := map[string]types.AttributeValue{"v": &types.AttributeValueMemberN{Value: "1"}}
	for name, write := range map[string]func() error{
		"take":           func() error { return stock.Take(ctx, "k", 1) },
		"debit":          func() error { return accounts.Debit(ctx, "a", 1) },
		"hold":           func() error { _, err := holds.Hold(ctx, "r", "h", time.Minute); return err },
		"fenced update":  func() error { return fenced.Update(ctx, client, key, 1, set) },
		"confirm a hold": func() error { return holds.Confirm(ctx, "r", "h") },
	} {
		err := write()
		var op *net.OpError
		if errors.Is(err, dynamoconditional.ErrAmbiguousCommit) || !errors.As(err, &op) || op.Op != "dial" {
			t.Errorf("%s with the connection refused: %v; want the dial error, not ErrAmbiguousCommit", name, err)
		}
	}
}
