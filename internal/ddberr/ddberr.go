// Package ddberr classifies DynamoDB errors the way nolock's packages need:
// does an error prove that a write was not applied.
package ddberr

import (
	"errors"
	"net"
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
