package inbox

import (
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/handlerfail"
	"github.com/nolock/nolock/internal/kafkapark"
)

// Permanent marks a handler's error as permanent: the message is parked
// at once instead of being retried. It means the same in package
// partition (an error marked by either package's Permanent is permanent
// in both).
func Permanent(err error) error { return handlerfail.MarkPermanent(err) }

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool { return handlerfail.IsPermanent(err) }

// HandlerError is a handler's failure: Err is what it returned (or a
// *PanicError), Msg the message it failed on, Index that message's
// position in Process's batch. Process and ReplayParked return one;
// EventRetry and EventParked carry its Err. partition.HandlerError means
// the same.
type HandlerError struct {
	Msg   kafka.Message
	Index int
	Err   error

	kind handlerfail.Kind // what the failure says about Msg
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("inbox: handler failed on %s: %v", kafkapark.EventKey(e.Msg.Topic, e.Msg.Partition, e.Msg.Offset), e.Err)
}

func (e *HandlerError) Unwrap() error { return e.Err }

// PanicError is a handler's panic that Run recovered: the message counts
// as failed (and is parked after the attempts), the process lives on.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
}

// Error gives the panic's value, then the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("inbox: handler panicked: %v\n%s", e.Value, e.Stack)
}

func newPanicError(value any, stack []byte) error { return &PanicError{value, stack} }
