package nolockotel

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/observe"
)

// call is a call begun by Start, in the context Start returns.
type call struct {
	name  string
	msg   *observe.Message
	start time.Time
	span  trace.Span
	ended atomic.Bool
}

type callKey struct{}

// Start begins call c: it starts a span named c.Name, a child of the span
// in ctx, and returns ctx with that span (so the spans the call's
// callbacks start, pgx's say, nest under it) and the call's start time,
// which End measures the call's duration from.
//
// For a consumer's call (c.Message set: inbox.handle, partition.handle)
// the span is of kind consumer, with messaging.system (kafka),
// messaging.operation.type and .name (process),
// messaging.destination.name, messaging.destination.partition.id and
// messaging.kafka.offset; and when the message's headers carry a trace
// context (as Inject wrote it, read with the Adapter's propagator), that
// context is the span's parent, the span in ctx (if any) a link. Other
// calls' spans are of kind internal, with nolock.key. Start does no I/O.
func (a *Adapter) Start(ctx context.Context, c observe.Call) context.Context {
	if ctx == nil {
		ctx = context.Background()
	}
	kind := trace.SpanKindInternal
	kv := make([]attribute.KeyValue, 0, 8)
	if c.Key != "" {
		kv = append(kv, AttrKey.String(c.Key))
	}
	opts := make([]trace.SpanStartOption, 0, 4)
	parent := ctx
	if m := c.Message; m != nil {
		kind = trace.SpanKindConsumer
		kv = append(kv, semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(m.Topic),
			semconv.MessagingDestinationPartitionID(strconv.Itoa(m.Partition)), semconv.MessagingKafkaOffset(int(m.Offset)))
		parent = a.propagator.Extract(ctx, headers(m.Headers))
		local := trace.SpanContextFromContext(ctx)
		if remote := trace.SpanContextFromContext(parent); local.IsValid() && !remote.Equal(local) {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: local}))
		}
	}
	opts = append(opts, trace.WithSpanKind(kind), trace.WithAttributes(kv...))
	out, span := a.tracer.Start(parent, c.Name, opts...)
	return context.WithValue(out, callKey{}, &call{name: c.Name, msg: c.Message, start: a.now(), span: span})
}

// End ends the call Start began in ctx, with its outcome e: it records
// the call's duration, measured from Start, in the one histogram of its
// meaning (see the Metric constants), with e's other measures, sets the
// span's nolock.event, error.type and status (Error, with the error
// recorded, when e.Err is set), and ends the span. An End with a context
// that no Start of this Adapter returned, or a second End of one call,
// counts e as Event does.
func (a *Adapter) End(ctx context.Context, e observe.Event) {
	if ctx == nil {
		ctx = context.Background()
	}
	errType := a.errType(e.Err)
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil || c.ended.Swap(true) {
		a.record(ctx, e, errType)
		return
	}
	a.recordCall(ctx, c, e, errType, a.now().Sub(c.start))
	c.span.SetAttributes(spanAttrs(e, errType)...)
	if e.Err != nil {
		c.span.RecordError(e.Err)
		c.span.SetStatus(codes.Error, e.Err.Error())
	}
	c.span.End()
}

// Event records e in its instruments and, inside a call (the span in ctx
// is recording), adds it to the call's span as a span event: a retry's
// with its wait as nolock.delay. An event outside a call (a lock's
// renewal, a coalesced batch) makes no span. Event does no I/O.
func (a *Adapter) Event(ctx context.Context, e observe.Event) {
	if ctx == nil {
		ctx = context.Background()
	}
	errType := a.errType(e.Err)
	a.record(ctx, e, errType)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	kv := spanAttrs(e, errType)
	if e.Duration != 0 {
		kv = append(kv, attrDelay.Float64(e.Duration.Seconds()))
	}
	if e.Err != nil {
		kv = append(kv, attrErrorMsg.String(e.Err.Error()))
	}
	span.AddEvent(e.Name, trace.WithAttributes(kv...))
}

// errType is err's error.type: the WithErrorType function's, else
// ErrorType's; "" for nil.
func (a *Adapter) errType(err error) string {
	if err == nil {
		return ""
	}
	if t := a.errorType(err); t != "" {
		return t
	}
	return ErrorType(err)
}

// attrDelay is an event's Duration on its span event, in seconds: a
// retry's wait.
const attrDelay = attribute.Key("nolock.delay")

// spanAttrs returns e's attributes for a span or span event.
func spanAttrs(e observe.Event, errType string) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 8)
	kv = append(kv, AttrEvent.String(e.Name))
	if e.Key != "" {
		kv = append(kv, AttrKey.String(e.Key))
	}
	if e.Token != 0 {
		kv = append(kv, AttrToken.Int64(e.Token))
	}
	if e.Attempt != 0 {
		kv = append(kv, AttrAttempt.Int(e.Attempt))
	}
	if e.N != 0 {
		kv = append(kv, AttrN.Int64(e.N))
	}
	if errType != "" {
		kv = append(kv, AttrErrorType.String(errType))
	}
	return kv
}
