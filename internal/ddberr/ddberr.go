// Package ddberr is nolock's one classification of DynamoDB errors, used by
// every package that talks to DynamoDB: what a failed request proves about
// a write (Of: not sent, refused, or unknown), whether a refusal can be
// overcome by sending the request again (Permanent), the item a failed
// condition returned (ConditionFailed, ConditionFailedAt), and the retry
// policy of writes (NoBlindRetries). It matches on types, HTTP statuses
// and error codes, never on message text.
//
// The retry policy, the same in every package:
//   - Every write is sent with NoBlindRetries. The SDK then retries it, with
//     its own backoff and attempt limit, only after an attempt that proves
//     nothing was applied: one that was not sent (the dial failed) or that
//     the server refused with a retryable code (throttling, a transaction
//     conflict). So throttling is retried with backoff everywhere, and a
//     throttle that outlasts the SDK's attempts reaches the caller as
//     Refused, and not Permanent.
//   - A write whose outcome is Unknown (a lost answer, a timeout, a 5xx) is
//     never retried blindly. The package either retries it as a write that
//     is idempotent by its condition (dynamolock's heartbeats and releases
//     are conditional on record versions of their own, so a second
//     application fails or matches), resolves it by reading the item
//     (dynamolock's acquire), or reports it to its caller as ambiguous
//     (ErrAmbiguousCommit in cas, conditional and idempotency).
//   - Reads keep the SDK's default retries: they change nothing.
//
// Of is sound for the error of a request sent with NoBlindRetries (or
// with the SDK's retries off): with blind retries, the last attempt's
// error says nothing of an earlier attempt that may have applied.
package ddberr

import (
	"context"
	"errors"
	"net"
	"net/http/httptrace"
	"slices"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/nolock/nolock/internal/outcome"
)

// Outcome is what an error proves about a write: the same type as pgerr's.
// For DynamoDB: Refused is a 4xx answer (a failed condition, a cancelled
// transaction, throttling, a validation error); Unknown a 5xx answer, a
// connection lost or a timeout after sending, a cancelled context, an
// error of a wrapping client.
type Outcome = outcome.Outcome

// The outcomes, from the caller's side.
const (
	Committed = outcome.Committed
	NotSent   = outcome.NotSent
	Refused   = outcome.Refused
	Unknown   = outcome.Unknown
)

// Of classifies err, returned by a DynamoDB request, by what may have
// reached the server (see Outcome). An error that carries an HTTP status
// had an answer: Refused for a 4xx, Unknown otherwise. A dial error had
// none and sent nothing: NotSent (the SDK reports a failed send as a
// response error with status 0, wrapping the dial error). Anything else is
// Unknown.
func Of(err error) Outcome {
	if err == nil {
		return Committed
	}
	var stopped *stoppedError
	if errors.As(err, &stopped) {
		return NotSent
	}
	if s := status(err); s != 0 {
		if s >= 400 && s < 500 {
			return Refused
		}
		return Unknown
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return NotSent
	}
	return Unknown
}

// status returns the HTTP status of the answer err carries, or 0 if none
// came.
func status(err error) int {
	var resp interface{ HTTPStatusCode() int }
	if errors.As(err, &resp) {
		return resp.HTTPStatusCode()
	}
	return 0
}

// NotApplied reports whether err proves that the request changed nothing:
// Of(err) is NotSent or Refused.
func NotApplied(err error) bool {
	o := Of(err)
	return o == NotSent || o == Refused
}

// Permanent reports whether err is a refusal that sending the same request
// again cannot overcome: a 4xx answer other than a failed condition, a
// cancelled transaction, throttling or a transaction conflict (a
// validation error, a missing table, denied access). A failed condition is
// not permanent: the item may change.
func Permanent(err error) bool {
	if Of(err) != Refused {
		return false
	}
	if status(err) == 429 {
		return false
	}
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		return true
	}
	code := apiErr.ErrorCode()
	switch code {
	case "ConditionalCheckFailedException", "TransactionCanceledException", "TransactionConflictException":
		return false
	}
	_, throttle := retry.DefaultThrottleErrorCodes[code]
	_, retryable := retry.DefaultRetryableErrorCodes[code]
	return !throttle && !retryable
}

// ConditionFailed reports whether err is a failed condition of a single
// write (ConditionalCheckFailedException), with the item the server
// returned with it. The item is nil when the server returned none: there
// was no item, or the request did not ask for it, or the server ignores
// ReturnValuesOnConditionCheckFailure (dynalite does), so only a read can
// tell.
func ConditionFailed(err error) (item map[string]types.AttributeValue, ok bool) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return nil, false
	}
	if len(ccf.Item) == 0 {
		return nil, true
	}
	return ccf.Item, true
}

// ConditionFailedAt reports whether err is a TransactWriteItems
// cancellation in which the action at index i (of the TransactItems sent)
// failed its condition. A transaction cancelled for any reason applied
// nothing.
func ConditionFailedAt(err error, i int) bool {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) || i < 0 || i >= len(tce.CancellationReasons) {
		return false
	}
	return aws.ToString(tce.CancellationReasons[i].Code) == "ConditionalCheckFailed"
}

// CancelledOnlyFor reports whether err is a TransactWriteItems
// cancellation for the reasons codes alone: at least one action failed
// with one of them, and none for another reason. Nothing was applied. For
// example, a transaction cancelled only for "ConditionalCheckFailed" and
// "TransactionConflict" lost a race with other writers: reading again may
// let it succeed.
func CancelledOnlyFor(err error, codes ...string) bool {
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return false
	}
	found := false
	for _, r := range tce.CancellationReasons {
		switch c := aws.ToString(r.Code); {
		case c == "" || c == "None":
		case slices.Contains(codes, c):
			found = true
		default:
			return false
		}
	}
	return found
}

// TransactionConflict reports whether err is a write refused only because
// a transaction was in progress on its item: a
// TransactionConflictException for a single write, or a transaction
// cancelled for "TransactionConflict" alone. Nothing was applied, and the
// same request may succeed later.
func TransactionConflict(err error) bool {
	var conflict *types.TransactionConflictException
	return errors.As(err, &conflict) || CancelledOnlyFor(err, "TransactionConflict")
}

// NoBlindRetries, passed as an option with a write, lets the SDK retry the
// write only after an attempt that NotApplied proves changed nothing (and
// that the SDK's retryer deems retryable: throttling, a conflict, a failed
// dial). The SDK otherwise retries after a lost connection, a timeout or a
// 5xx answer: for a write that is not idempotent (a decrement) a retry
// after one that applied but whose answer was lost would apply it twice, a
// conditional retry would report the first one's effect as a refusal, and
// the final error (a throttle, say) would hide that the first one may have
// applied. With it, such a failure reaches the caller as Unknown.
//
// A write whose ctx ends before an attempt or during the SDK's backoff
// before a retry (the SDK then returns the ctx's error, dropping the
// attempt's) is NotSent: under NoBlindRetries every attempt before it
// proved that nothing was applied. So is a write none of whose attempts
// got a connection, whatever error it ends with.
func NoBlindRetries(o *dynamodb.Options) {
	if o.Retryer == nil {
		return
	}
	inner, ok := o.Retryer.(aws.RetryerV2)
	if !ok {
		inner = retryerV2{o.Retryer}
	}
	o.Retryer = notAppliedOnly{inner}
	o.APIOptions = append(slices.Clip(o.APIOptions), func(s *middleware.Stack) error {
		return s.Finalize.Add(stoppedBetweenAttempts{}, middleware.Before)
	})
}

// stoppedBetweenAttempts, outside the SDK's retry middleware, marks the
// errors with which it ends a write when ctx ended while no attempt was
// in flight (the bare ctx error before an attempt, and
// *aws.RequestCanceledError from the backoff before a retry), and any
// error of a write none of whose attempts got a connection (one whose
// dial ctx cut short comes back as a cancellation, without the dial
// error).
type stoppedBetweenAttempts struct{}

func (stoppedBetweenAttempts) ID() string { return "nolock.StoppedBetweenAttempts" }

func (stoppedBetweenAttempts) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (
	middleware.FinalizeOutput, middleware.Metadata, error) {
	var connected atomic.Bool // an attempt got a connection: it may have written
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	out, md, err := next.HandleFinalize(ctx, in)
	if _, canceled := err.(*aws.RequestCanceledError); err != nil && (!connected.Load() || canceled || err == context.Canceled || err == context.DeadlineExceeded) {
		err = &stoppedError{err}
	}
	return out, md, err
}

// stoppedError is the error of a write that sent nothing that could
// apply: its ctx ended with no attempt in flight, every earlier one having
// proved that nothing was applied, or no attempt got a connection.
type stoppedError struct{ err error }

func (e *stoppedError) Error() string { return e.err.Error() + " (nothing sent)" }
func (e *stoppedError) Unwrap() error { return e.err }

// notAppliedOnly narrows a retryer to errors that prove nothing was
// applied.
type notAppliedOnly struct{ aws.RetryerV2 }

func (r notAppliedOnly) IsErrorRetryable(err error) bool {
	return NotApplied(err) && r.RetryerV2.IsErrorRetryable(err)
}

// retryerV2 adapts an aws.Retryer the way the SDK does.
type retryerV2 struct{ aws.Retryer }

func (r retryerV2) GetAttemptToken(context.Context) (func(error) error, error) {
	return r.GetInitialToken(), nil
}
