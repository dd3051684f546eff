package partition

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/handlerfail"
	"github.com/nolock/nolock/internal/handlerpanic"
	"github.com/nolock/nolock/internal/kafkapark"
)

// Permanent marks a Handler's error as permanent: the batch is split at
// once and the message it names is parked on its first attempt on its
// own instead of being retried. It means the same in package inbox (an
// error marked by either package's Permanent is permanent in both).
func Permanent(err error) error { return handlerfail.MarkPermanent(err) }

// IsPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func IsPermanent(err error) bool { return handlerfail.IsPermanent(err) }

// HandlerError is a Handler's failure: Err is what it returned (or a
// *PanicError), Msg the first message of the batch it failed on. A batch
// of several that fails is split, so the error a message is parked with
// names that message. ReplayParked returns one; EventRetry and EventParked
// carry one as Err. inbox.HandlerError means the same.
type HandlerError struct {
	Msg kafka.Message
	Err error
}

func (e *HandlerError) Error() string {
	return fmt.Sprintf("partition: handler failed on %s: %v", kafkapark.EventKey(e.Msg.Topic, e.Msg.Partition, e.Msg.Offset), e.Err)
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
	return fmt.Sprintf("partition: handler panicked: %v\n%s", e.Value, e.Stack)
}

func newPanicError(value any, stack []byte) error { return &PanicError{value, stack} }

// callHandler runs h, turning a panic into a *PanicError: the handler runs
// on a kafka-go goroutine, where an unrecovered panic ends the process.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, msgs []kafka.Message) (err error) {
	defer handlerpanic.Recover(&err, newPanicError)
	return h(ctx, tx, msgs)
}
