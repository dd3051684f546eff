package ddberr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/nolock/nolock/internal/testenv"
)

// answered builds the error the SDK returns for an answer with status and
// the API error apiErr, wrapped as the SDK wraps it.
func answered(status int, apiErr error) error {
	return &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      apiErr,
		},
	}}
}

// sendFailed builds the error the SDK returns when sending failed with err:
// a response error with status 0.
func sendFailed(err error) error {
	return &smithy.OperationError{ServiceID: "DynamoDB", OperationName: "UpdateItem", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{}},
			Err:      &smithyhttp.RequestSendError{Err: &url.Error{Op: "Post", URL: "http://127.0.0.1:1/", Err: err}},
		},
	}}
}

func code(c string) error { return &smithy.GenericAPIError{Code: c, Message: "m"} }

func TestOf(t *testing.T) {
	// A freed loopback port refuses connections: a real dial error.
	_, dialErr := (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp", strings.TrimPrefix(testenv.RefusedEndpoint(t), "http://"))
	if dialErr == nil {
		t.Fatal("a dial to a freed port connected")
	}
	item := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}
	for _, tc := range []struct {
		name      string
		err       error
		outcome   Outcome
		permanent bool
	}{
		{"no error", nil, Committed, false},
		{"condition failed", answered(400, &types.ConditionalCheckFailedException{Item: item}), Refused, false},
		{"transaction cancelled", answered(400, &types.TransactionCanceledException{}), Refused, false},
		{"transaction conflict", answered(400, &types.TransactionConflictException{}), Refused, false},
		{"throttled", answered(400, &types.ProvisionedThroughputExceededException{}), Refused, false},
		{"throttled (generic code)", answered(400, code("ThrottlingException")), Refused, false},
		{"request limit", answered(400, &types.RequestLimitExceeded{}), Refused, false},
		{"too many requests (429)", answered(429, code("Whatever")), Refused, false},
		{"validation error", answered(400, code("ValidationException")), Refused, true},
		{"missing table", answered(400, &types.ResourceNotFoundException{}), Refused, true},
		{"status without API error", answered(403, errors.New("denied")), Refused, true},
		{"server error (500)", answered(500, &types.InternalServerError{}), Unknown, false},
		{"unavailable (503)", answered(503, code("ServiceUnavailable")), Unknown, false},
		{"connection refused", sendFailed(dialErr), NotSent, false},
		{"connection refused, unwrapped", fmt.Errorf("send: %w", dialErr), NotSent, false},
		{"connection lost after sending (SDK-wrapped)", sendFailed(io.ErrUnexpectedEOF), Unknown, false},
		{"dial timed out", &net.OpError{Op: "dial", Err: context.DeadlineExceeded}, NotSent, false},
		{"connection lost after sending", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), Unknown, false},
		{"read error on a connection", &net.OpError{Op: "read", Err: errors.New("reset")}, Unknown, false},
		{"timed out", context.DeadlineExceeded, Unknown, false},
		{"a wrapper's own error", errors.New("injected"), Unknown, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Of(tc.err); got != tc.outcome {
				t.Errorf("Of(%v) = %v, want %v", tc.err, got, tc.outcome)
			}
			if got, want := NotApplied(tc.err), tc.outcome == NotSent || tc.outcome == Refused; got != want {
				t.Errorf("NotApplied = %v, want %v", got, want)
			}
			if got := Permanent(tc.err); got != tc.permanent {
				t.Errorf("Permanent = %v, want %v", got, tc.permanent)
			}
		})
	}
}

func TestConditionFailed(t *testing.T) {
	item := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}
	if got, ok := ConditionFailed(answered(400, &types.ConditionalCheckFailedException{Item: item})); !ok || got["pk"] == nil {
		t.Errorf("with the item: %v, %v; want the item, true", got, ok)
	}
	if got, ok := ConditionFailed(answered(400, &types.ConditionalCheckFailedException{})); !ok || got != nil {
		t.Errorf("without the item: %v, %v; want nil, true", got, ok)
	}
	if _, ok := ConditionFailed(answered(400, &types.ProvisionedThroughputExceededException{})); ok {
		t.Error("a throttle reported as a failed condition")
	}
	tce := answered(400, &types.TransactionCanceledException{CancellationReasons: []types.CancellationReason{
		{Code: aws.String("None")}, {Code: aws.String("ConditionalCheckFailed")},
	}})
	for i, want := range []bool{false, true, false, false} {
		if got := ConditionFailedAt(tce, i); got != want {
			t.Errorf("ConditionFailedAt(%d) = %v, want %v", i, got, want)
		}
	}
	if ConditionFailedAt(answered(400, &types.ConditionalCheckFailedException{}), 0) {
		t.Error("ConditionFailedAt reports a single write's failed condition")
	}
	cancelled := func(codes ...string) error {
		var rs []types.CancellationReason
		for _, c := range codes {
			rs = append(rs, types.CancellationReason{Code: aws.String(c)})
		}
		return answered(400, &types.TransactionCanceledException{CancellationReasons: rs})
	}
	for _, tc := range []struct {
		err             error
		conflict, raced bool
	}{
		{cancelled("None", "TransactionConflict"), true, true},
		{cancelled("ConditionalCheckFailed", "TransactionConflict"), false, true},
		{cancelled("ConditionalCheckFailed", "None"), false, true},
		{cancelled("ValidationError", "TransactionConflict"), false, false},
		{cancelled("None", "None"), false, false},
		{cancelled(), false, false},
		{answered(400, &types.TransactionConflictException{}), true, false},
		{answered(400, &types.ConditionalCheckFailedException{}), false, false},
	} {
		if got := TransactionConflict(tc.err); got != tc.conflict {
			t.Errorf("TransactionConflict(%v) = %v, want %v", tc.err, got, tc.conflict)
		}
		if got := CancelledOnlyFor(tc.err, "ConditionalCheckFailed", "TransactionConflict"); got != tc.raced {
			t.Errorf("CancelledOnlyFor(%v, raced) = %v, want %v", tc.err, got, tc.raced)
		}
	}
	if Outcome(0).String() != "invalid outcome" || NotSent.String() != "not sent" {
		t.Errorf("String: %q, %q", Outcome(0), NotSent)
	}
}

// With NoBlindRetries the SDK retries a write after a throttle (nothing
// applied) but sends it once after a 500 (it may have applied); without
// it, the SDK retries both.
func TestNoBlindRetries(t *testing.T) {
	var calls atomic.Int64
	var answers atomic.Pointer[[]int] // per call, the status to answer with
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(calls.Add(1)) - 1
		status := http.StatusOK
		if a := *answers.Load(); n < len(a) {
			status = a[n]
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(status)
		switch status {
		case http.StatusOK:
			io.WriteString(w, `{}`)
		case http.StatusBadRequest:
			io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"slow down"}`)
		default:
			io.WriteString(w, `{"__type":"com.amazonaws.dynamodb#InternalServerError","message":"oops"}`)
		}
	}))
	defer srv.Close()
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: aws.AnonymousCredentials{}, HTTPClient: srv.Client(),
	})
	in := &dynamodb.UpdateItemInput{TableName: aws.String("t"),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}}
	for _, tc := range []struct {
		name    string
		answers []int
		opts    []func(*dynamodb.Options)
		calls   int64
		outcome Outcome
	}{
		{"throttled, then applied", []int{400, 400}, []func(*dynamodb.Options){NoBlindRetries}, 3, Committed},
		{"5xx: sent once", []int{500, 500}, []func(*dynamodb.Options){NoBlindRetries}, 1, Unknown},
		{"throttled, then 5xx: stops at the 5xx", []int{400, 500, 500}, []func(*dynamodb.Options){NoBlindRetries}, 2, Unknown},
		{"5xx without the option: retried blindly", []int{500}, nil, 2, Committed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls.Store(0)
			answers.Store(&tc.answers)
			_, err := client.UpdateItem(context.Background(), in, tc.opts...)
			if got := calls.Load(); got != tc.calls || Of(err) != tc.outcome {
				t.Fatalf("%d calls, outcome %v (%v); want %d calls, %v", got, Of(err), err, tc.calls, tc.outcome)
			}
		})
	}
}

// A real SDK client whose connections are refused: the error is NotSent,
// and NoBlindRetries lets the SDK retry it (nothing was sent).
func TestRefusedDialIsNotSent(t *testing.T) {
	refused := testenv.RefusedEndpoint(t)
	var attempts atomic.Int64
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(refused), Credentials: aws.AnonymousCredentials{},
		HTTPClient: &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			attempts.Add(1)
			return http.DefaultTransport.RoundTrip(r)
		})},
	})
	_, err := client.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{TableName: aws.String("t"),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}}, NoBlindRetries)
	if Of(err) != NotSent || Permanent(err) {
		t.Fatalf("refused dial: %v (%v, permanent %v); want not sent, not permanent", Of(err), err, Permanent(err))
	}
	if n := attempts.Load(); n < 2 {
		t.Fatalf("%d attempts; want the SDK to retry a dial that sent nothing", n)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A write whose ctx ends during the SDK's backoff before a retry gets the
// ctx's error from the SDK, without the refused attempt's: under
// NoBlindRetries it is NotSent (the attempt before it proved that nothing
// was applied), still with the ctx's error in its chain; without the
// option, where the SDK also retries after a timeout, it stays Unknown.
func TestStoppedInBackoffIsNotSent(t *testing.T) {
	refused := testenv.RefusedEndpoint(t)
	backoff := backoffProbe(make(chan struct{}, 1))
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(refused), Credentials: aws.AnonymousCredentials{},
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) { o.Backoff = backoff }),
	})
	in := &dynamodb.UpdateItemInput{TableName: aws.String("t"),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}}
	for _, tc := range []struct {
		name string
		opts []func(*dynamodb.Options)
		want Outcome
	}{
		{"with NoBlindRetries", []func(*dynamodb.Options){NoBlindRetries}, NotSent},
		{"without", nil, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { // the ctx ends once the refused attempt is in its backoff
				select {
				case <-backoff:
					cancel()
				case <-ctx.Done():
				}
			}()
			_, err := client.UpdateItem(ctx, in, tc.opts...)
			var canceled *aws.RequestCanceledError
			if !errors.As(err, &canceled) || !errors.Is(err, context.Canceled) || Of(err) != tc.want {
				t.Fatalf("%v: outcome %v; want the SDK's cancelled backoff, %v", err, Of(err), tc.want)
			}
		})
	}
}

// backoffProbe is a retry backoff of a minute, longer than any test waits,
// that says on the channel when the SDK enters it.
type backoffProbe chan struct{}

func (b backoffProbe) BackoffDelay(int, error) (time.Duration, error) {
	select {
	case b <- struct{}{}:
	default:
	}
	return time.Minute, nil
}

// Under NoBlindRetries, a write whose ctx ends while it dials (the SDK
// then reports a cancellation, without the dial) sent nothing: NotSent.
// One whose ctx ends once its request has reached the server is
// Unknown.
func TestCutBeforeAConnectionIsNotSent(t *testing.T) {
	hang := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		arrived <- struct{}{}
		<-hang
	}))
	defer srv.Close()
	defer close(hang) // before Close, which waits for the handler
	stuck := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		<-ctx.Done() // a dial that never completes
		return nil, ctx.Err()
	}}
	in := &dynamodb.UpdateItemInput{TableName: aws.String("t"),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}}
	for _, tc := range []struct {
		name string
		http *http.Client
		sent bool // the ctx ends once the request has reached the server, not at a deadline
		want Outcome
	}{
		{"dialing", &http.Client{Transport: stuck}, false, NotSent},
		{"sent, unanswered", srv.Client(), true, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := dynamodb.New(dynamodb.Options{
				Region: "us-east-1", BaseEndpoint: aws.String(srv.URL), Credentials: aws.AnonymousCredentials{}, HTTPClient: tc.http,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			end := context.DeadlineExceeded
			if tc.sent {
				cancel()
				ctx, cancel = context.WithCancel(context.Background())
				end = context.Canceled
				go func() {
					select {
					case <-arrived:
					case <-ctx.Done(): // the call failed before: the subtest's cancel
					}
					cancel()
				}()
			}
			defer cancel()
			_, err := client.UpdateItem(ctx, in, NoBlindRetries)
			if !errors.Is(err, end) || Of(err) != tc.want {
				t.Fatalf("%v: outcome %v; want %v, %v", err, Of(err), end, tc.want)
			}
		})
	}
}
