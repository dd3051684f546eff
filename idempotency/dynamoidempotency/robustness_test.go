package dynamoidempotency_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// lostThenThrottled delivers the first TransactWriteItems and loses its
// reply, then answers every later one with a throttle (400): what the
// SDK's own retries would turn into a plain error hiding the commit.
type lostThenThrottled struct {
	next  http.RoundTripper
	armed atomic.Bool
	seen  atomic.Int64
}

func (l *lostThenThrottled) RoundTrip(req *http.Request) (*http.Response, error) {
	if !l.armed.Load() || !strings.HasSuffix(req.Header.Get("X-Amz-Target"), ".TransactWriteItems") {
		return l.next.RoundTrip(req)
	}
	if l.seen.Add(1) == 1 {
		resp, err := l.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	}
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}`
	return &http.Response{StatusCode: 400, Status: "400 Bad Request", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:   io.NopCloser(bytes.NewReader([]byte(body))), ContentLength: int64(len(body)), Request: req}, nil
}

// The SDK does not retry a transaction whose reply was lost: Do reports
// ErrAmbiguousCommit (the debit did commit), not the later throttle.
func TestDynamoDBLostReplyIsNotHiddenBySDKRetries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newDynamoBed(t, nil)
	tr := &lostThenThrottled{next: services.OwnBody(services.DynamoDBTransport())}
	client := services.DynamoDBClient(os.Getenv(testenv.EnvDynamoDBTx), &http.Client{Transport: tr})
	store, err := dynamoidempotency.New(client, b.table)
	if err != nil {
		t.Fatal(err)
	}
	tr.armed.Store(true)
	_, err = store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), b.pay("pay-1", 500))
	if !errors.Is(err, dynamoidempotency.ErrAmbiguousCommit) || tr.seen.Load() != 1 || b.amount("wallet/alice") != initial-500 {
		t.Fatalf("lost reply: %v after %d sends, balance %d; want ErrAmbiguousCommit after 1, the debit committed",
			err, tr.seen.Load(), b.amount("wallet/alice"))
	}
}
