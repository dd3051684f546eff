package nolockotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/observe"
)

// span ends a span named e.Name under the span in ctx, from e.Duration
// ago to now: every span the Adapter makes is made here.
func (a *Adapter) span(ctx context.Context, e observe.Event, errType string) {
	end := a.now()
	_, span := a.tracer.Start(ctx, e.Name, trace.WithTimestamp(end.Add(-e.Duration)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(spanAttrs(e, errType)...))
	if e.Err != nil {
		span.RecordError(e.Err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// addSpanEvent adds e as an event of the span in ctx, if it is recording.
func addSpanEvent(ctx context.Context, e observe.Event, errType string) {
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

// attrDelay is a retry's span event's wait, in seconds.
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
