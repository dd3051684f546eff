// Package ddberr classifies DynamoDB errors the way nolock's packages need
// (does an error prove that a write was not applied) and keeps the SDK from
// retrying writes that may have applied.
package ddberr

import (
	"context"
	"errors"
	"net"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// Refused reports whether err proves that a request was not applied: the
// server answered it with a 4xx status (a failed condition, a cancelled
// transaction, throttling, a validation error), or no connection to the
// server was made. Any other failure (a 5xx answer, a connection lost or a
// timeout after the request was sent, a cancelled context) may follow an
// applied write.
func Refused(err error) bool {
	var resp interface{ HTTPStatusCode() int }
	if errors.As(err, &resp) {
		return resp.HTTPStatusCode() >= 400 && resp.HTTPStatusCode() < 500
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// NoBlindRetries, passed as an option with a write, lets the SDK retry the
// write only when the server refused it (Refused: throttling). The SDK
// otherwise retries after a lost connection, a timeout or a 5xx answer:
// for a write that is not idempotent (a decrement) a retry after one that
// applied but whose answer was lost would apply it twice, a conditional
// retry would report the first one's effect as a refusal, and the final
// error (a throttle, say) would hide that the first one may have applied.
// With it, such a failure reaches the caller to be reported as ambiguous.
func NoBlindRetries(o *dynamodb.Options) {
	if o.Retryer == nil {
		return
	}
	inner, ok := o.Retryer.(aws.RetryerV2)
	if !ok {
		inner = retryerV2{o.Retryer}
	}
	o.Retryer = refusedOnly{inner}
}

// refusedOnly narrows a retryer to errors that prove nothing was applied.
type refusedOnly struct{ aws.RetryerV2 }

func (r refusedOnly) IsErrorRetryable(err error) bool {
	return Refused(err) && r.RetryerV2.IsErrorRetryable(err)
}

// retryerV2 adapts an aws.Retryer the way the SDK does.
type retryerV2 struct{ aws.Retryer }

func (r retryerV2) GetAttemptToken(context.Context) (func(error) error, error) {
	return r.GetInitialToken(), nil
}
