package nolockotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/observe"
)

// heldError stands for a typed error of the library (*lease.HeldError).
type heldError struct{ holder string }

func (e *heldError) Error() string { return "held by " + e.holder }

// errConflict has cas.ErrConflict's text: ErrorType names it as it.
var errConflict = errors.New("cas: version conflict")

// clock is a fake clock for the Adapter's measures: it moves only when
// told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

// call runs one call on o: Start, the clock moves d, the events, End with
// end. It returns the context Start returned.
func call(ctx context.Context, o observe.Observer, clk *clock, c observe.Call, d time.Duration, end observe.Event, events ...observe.Event) context.Context {
	ctx = o.Start(ctx, c)
	clk.add(d)
	for _, e := range events {
		o.Event(ctx, e)
	}
	o.End(ctx, end)
	return ctx
}

// Calls' durations, measured from Start to End, land each in the one
// histogram of their meaning, and other events each in the one
// instrument of theirs, counted exactly by name and error type; batch
// sizes, holds, locks held and Dropped are recorded; no key reaches a
// metric (a consumer's topic and partition do, as messaging.*
// attributes). An End without a Start counts as an outcome.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	clk := &clock{t: time.Unix(0, 0)}
	nolockotel.SetNow(b.a, clk.now)
	ctx := context.Background()
	var obs observe.Observer = b.a
	for i := range 3 {
		obs.Event(ctx, observe.Event{Name: "cas.conflict", Key: fmt.Sprint("doc-", i), Attempt: i + 1, Err: fmt.Errorf("update: %w", errConflict)})
	}
	for range 2 {
		obs.Event(ctx, observe.Event{Name: "cas.retry", Key: "doc", Attempt: 1, Duration: 10 * time.Millisecond, Err: errConflict})
	}
	obs.Event(ctx, observe.Event{Name: "cas.committed", Key: "doc", N: 5})
	obs.Event(ctx, observe.Event{Name: "cas.committed", Key: "doc", N: 3})
	obs.Event(ctx, observe.Event{Name: "conditional.batch", Key: "sku", N: 7})
	obs.Event(ctx, observe.Event{Name: "inbox.committed", Key: "t/0", N: 4, Duration: time.Second})
	msg := &observe.Message{Topic: "orders", Partition: 3, Offset: 40}
	call(ctx, obs, clk, observe.Call{Name: "partition.handle", Key: "orders/3", Message: msg}, 200*time.Millisecond,
		observe.Event{Name: "partition.committed", Key: "orders/3", Token: 2, N: 10, Duration: time.Hour},
		observe.Event{Name: "partition.parked", Key: "orders/3@41", Token: 2, N: 1, Attempt: 3, Err: errors.New("poison")})
	call(ctx, obs, clk, observe.Call{Name: "lease.acquire", Key: "k"}, 50*time.Millisecond,
		observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 1, Duration: time.Hour})
	for _, k := range []string{"k", "k2"} {
		call(ctx, obs, clk, observe.Call{Name: "dynamolock.try_acquire", Key: k}, 25*time.Millisecond,
			observe.Event{Name: "dynamolock.acquired", Key: k, Token: 1, Attempt: 1})
	}
	obs.Event(ctx, observe.Event{Name: "dynamolock.lost", Key: "k2", Token: 1, Err: fmt.Errorf("lost: %w", errors.New("dynamolock: lock lost"))})
	call(ctx, obs, clk, observe.Call{Name: "lease.acquire", Key: "k"}, time.Second,
		observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Err: fmt.Errorf("lease: not acquired: %w", &heldError{"other"})})
	call(ctx, obs, clk, observe.Call{Name: "lease.acquire", Key: "k"}, time.Second,
		observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Err: fmt.Errorf("wait: %w", context.DeadlineExceeded)})
	obs.Event(ctx, observe.Event{Name: "lease.renewed", Key: "k", Token: 9, Duration: 2 * time.Millisecond, Dropped: 4})
	call(ctx, obs, clk, observe.Call{Name: "lease.release", Key: "k"}, 3*time.Millisecond,
		observe.Event{Name: "lease.released", Key: "k", Token: 9, Duration: 3 * time.Second})
	call(ctx, obs, clk, observe.Call{Name: "idempotency.do", Key: "order-1"}, 4*time.Millisecond,
		observe.Event{Name: "idempotency.replayed", Key: "order-1", Duration: time.Hour})
	obs.End(ctx, observe.Event{Name: "cas.updated", Key: "doc"}) // no Start

	m := b.collect(t)
	equalMaps(t, nolockotel.MetricOutcomes, m.counts(t), map[string]int64{
		"cas.conflict/cas.ErrConflict":           3,
		"cas.committed":                          2,
		"conditional.batch":                      1,
		"inbox.committed":                        1,
		"partition.parked/_OTHER":                1,
		"dynamolock.lost/dynamolock.ErrLockLost": 1,
		"cas.updated":                            1,
	})
	equalMaps(t, nolockotel.MetricRetries, m.counts(t, nolockotel.MetricRetries), map[string]int64{"cas.retry/cas.ErrConflict": 2})
	equalMaps(t, nolockotel.MetricLocksHeld, m.counts(t, nolockotel.MetricLocksHeld), map[string]int64{"lease": 0, "dynamolock": 1})
	equalMaps(t, nolockotel.MetricDropped, m.counts(t, nolockotel.MetricDropped), map[string]int64{"": 4})
	for name, want := range map[string]map[string][2]float64{
		nolockotel.MetricLockWait: {
			"lease.acquired":      {1, 0.05},
			"dynamolock.acquired": {2, 0.05},
			"lease.not_acquired/*nolockotel_test.heldError": {1, 1},
			"lease.not_acquired/context.DeadlineExceeded":   {1, 1},
		},
		nolockotel.MetricLockRenewal: {"lease.renewed": {1, 0.002}},
		nolockotel.MetricLockHold:    {"lease.released": {1, 3}},
		nolockotel.MetricOperationDuration: {
			"lease.released":       {1, 0.003},
			"idempotency.replayed": {1, 0.004},
		},
		nolockotel.MetricProcessDuration: {
			"partition.committed messaging.destination.name=orders messaging.destination.partition.id=3 messaging.operation.name=process messaging.system=kafka": {1, 0.2},
		},
	} {
		equalMaps(t, name+" (count, sum)", histogram[float64](t, m, name), want)
	}
	equalMaps(t, "nolock.batch.size (count, sum)", histogram[int64](t, m, nolockotel.MetricBatchSize), map[string][2]float64{
		"cas.committed":       {2, 8},
		"conditional.batch":   {1, 7},
		"inbox.committed":     {1, 4},
		"partition.committed": {1, 10},
	})
}

// A call is a span from its Start to its End, a child of the span in the
// context Start got, of kind internal, named after the call, with the
// outcome's attributes and, with an error, status Error. The events
// inside the call are its span's events (a retry's with its wait); an
// event outside a call makes no span. No span is back-dated.
func TestSpans(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, caller := b.tp.Tracer("test").Start(context.Background(), "caller")
	before := time.Now()
	var obs observe.Observer = b.a
	in := obs.Start(ctx, observe.Call{Name: "lease.acquire", Key: "k"})
	obs.Event(in, observe.Event{Name: "lease.contended", Key: "k", Token: 3, Attempt: 1})
	obs.End(in, observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 2, Duration: time.Hour})
	in = obs.Start(ctx, observe.Call{Name: "cas.retry_op"})
	obs.Event(in, observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})
	obs.Event(in, observe.Event{Name: "cas.retry", Attempt: 1, Duration: 20 * time.Millisecond, Err: errConflict})
	obs.End(in, observe.Event{Name: "cas.failed", Attempt: 2, Err: context.DeadlineExceeded})
	obs.End(in, observe.Event{Name: "cas.failed", Attempt: 2, Err: context.DeadlineExceeded}) // a second End: no span
	obs.Event(ctx, observe.Event{Name: "lease.renewed", Key: "k", Token: 9, Duration: time.Millisecond})
	caller.End()
	after := time.Now()
	obs.Event(context.Background(), observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans.Ended() {
		spans[s.Name()] = s
		if s.StartTime().Before(before) && s.Name() != "caller" || s.EndTime().After(after) {
			t.Errorf("span %s from %v to %v, outside the test's %v to %v", s.Name(), s.StartTime(), s.EndTime(), before, after)
		}
	}
	if len(spans) != 3 || len(b.spans.Ended()) != 3 {
		t.Fatalf("spans %v: want caller, lease.acquire and cas.retry_op", spans)
	}
	parent := spans["caller"]
	for _, name := range []string{"lease.acquire", "cas.retry_op"} {
		s := spans[name]
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s's parent %v, want the caller's span %v", name, s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("%s: kind %v, want internal", name, s.SpanKind())
		}
		if s.InstrumentationScope().Version != nolockotel.Version || s.InstrumentationScope().SchemaURL != nolockotel.SchemaURL {
			t.Errorf("%s: scope %+v, want version and schema URL", name, s.InstrumentationScope())
		}
	}
	acq := spans["lease.acquire"]
	wantAttrs(t, "lease.acquire", acq.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("lease.acquired"), nolockotel.AttrKey: attribute.StringValue("k"),
		nolockotel.AttrToken: attribute.Int64Value(9), nolockotel.AttrAttempt: attribute.IntValue(2),
	})
	if acq.Status().Code != codes.Unset {
		t.Errorf("lease.acquire status %v, want unset", acq.Status())
	}
	if ev := acq.Events(); len(ev) != 1 || ev[0].Name != "lease.contended" {
		t.Errorf("lease.acquire's span events %+v: want lease.contended", ev)
	}
	op := spans["cas.retry_op"]
	if op.Status().Code != codes.Error || op.Status().Description != context.DeadlineExceeded.Error() {
		t.Errorf("cas.retry_op status %+v, want Error with the error's text", op.Status())
	}
	wantAttrs(t, "cas.retry_op", op.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("cas.failed"), nolockotel.AttrAttempt: attribute.IntValue(2),
		nolockotel.AttrErrorType: attribute.StringValue("context.DeadlineExceeded"),
	})
	events := op.Events()
	if len(events) != 3 || events[0].Name != "cas.conflict" || events[1].Name != "cas.retry" || events[2].Name != "exception" {
		t.Fatalf("cas.retry_op's span events %+v: want cas.conflict, cas.retry, exception", events)
	}
	wantAttrs(t, "the cas.conflict span event", events[0].Attributes, map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("cas.conflict"), nolockotel.AttrKey: attribute.StringValue("doc"),
		nolockotel.AttrAttempt: attribute.IntValue(1), nolockotel.AttrErrorType: attribute.StringValue("cas.ErrConflict"),
		"error.message": attribute.StringValue(errConflict.Error()),
	})
	wantAttrs(t, "the cas.retry span event", events[1].Attributes, map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("cas.retry"), nolockotel.AttrAttempt: attribute.IntValue(1),
		nolockotel.AttrErrorType: attribute.StringValue("cas.ErrConflict"), "nolock.delay": attribute.Float64Value(0.02),
		"error.message": attribute.StringValue(errConflict.Error()),
	})
	if ev := parent.Events(); len(ev) != 1 || ev[0].Name != "lease.renewed" {
		t.Errorf("caller's span events %+v: want lease.renewed, an event outside a call on the span in its context", ev)
	}
}

// A consumer's call is a consumer span with the messaging attributes,
// whose parent is the producer's context from the message's headers (the
// span in Start's context a link); without one in the headers, its
// parent is the span in Start's context.
func TestConsumerSpan(t *testing.T) {
	t.Parallel()
	b := newBed(t, nolockotel.WithPropagator(propagation.TraceContext{}))
	tr := b.tp.Tracer("test")
	pctx, producer := tr.Start(context.Background(), "produce", trace.WithSpanKind(trace.SpanKindProducer))
	var km kafka.Message
	b.a.Inject(pctx, &km)
	producer.End()
	hs := make([]observe.Header, len(km.Headers))
	for i, h := range km.Headers {
		hs[i] = observe.Header{Key: h.Key, Value: h.Value}
	}
	ctx, run := tr.Start(context.Background(), "run")
	for _, h := range [][]observe.Header{hs, nil} {
		in := b.a.Start(ctx, observe.Call{Name: "inbox.handle", Key: "t/2@7", Message: &observe.Message{Topic: "t", Partition: 2, Offset: 7, Headers: h}})
		b.a.End(in, observe.Event{Name: "inbox.handled", Key: "t/2@7", N: 1})
	}
	run.End()
	var handled []sdktrace.ReadOnlySpan
	for _, s := range b.spans.Ended() {
		if s.Name() == "inbox.handle" {
			handled = append(handled, s)
		}
	}
	if len(handled) != 2 {
		t.Fatalf("%d inbox.handle spans, want 2", len(handled))
	}
	for i, s := range handled {
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("inbox.handle: kind %v, want consumer", s.SpanKind())
		}
		wantAttrs(t, "inbox.handle", s.Attributes(), map[attribute.Key]attribute.Value{
			nolockotel.AttrEvent: attribute.StringValue("inbox.handled"), nolockotel.AttrKey: attribute.StringValue("t/2@7"),
			nolockotel.AttrN: attribute.Int64Value(1), "messaging.system": attribute.StringValue("kafka"),
			"messaging.operation.type": attribute.StringValue("process"), "messaging.operation.name": attribute.StringValue("process"),
			"messaging.destination.name": attribute.StringValue("t"), "messaging.destination.partition.id": attribute.StringValue("2"),
			"messaging.kafka.offset": attribute.IntValue(7),
		})
		want, links := producer.SpanContext(), 1
		if i == 1 {
			want, links = run.SpanContext(), 0
		}
		if s.Parent().SpanID() != want.SpanID() || s.SpanContext().TraceID() != want.TraceID() || !s.Parent().IsRemote() == (i == 0) {
			t.Errorf("inbox.handle %d: parent %v (remote %v), want %v", i, s.Parent().SpanID(), s.Parent().IsRemote(), want.SpanID())
		}
		if len(s.Links()) != links || links == 1 && s.Links()[0].SpanContext.SpanID() != run.SpanContext().SpanID() {
			t.Errorf("inbox.handle %d: links %+v, want %d to the span in Start's context", i, s.Links(), links)
		}
	}
}

func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]attribute.Value) {
	t.Helper()
	have := map[attribute.Key]attribute.Value{}
	for _, kv := range got {
		have[kv.Key] = kv.Value
	}
	for k, v := range want {
		if have[k] != v {
			t.Errorf("%s: %s = %v, want %v", what, k, have[k].String(), v.String())
		}
	}
	for k, v := range have {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: unexpected attribute %s = %v", what, k, v.String())
		}
	}
}

// New refuses a nil option or provider, naming it.
func TestNewRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opt  nolockotel.Option
		want string
	}{
		{"nil option", nil, "option 0 is nil"},
		{"nil meter provider", nolockotel.WithMeterProvider(nil), "WithMeterProvider(nil)"},
		{"nil tracer provider", nolockotel.WithTracerProvider(nil), "WithTracerProvider(nil)"},
		{"nil error type", nolockotel.WithErrorType(nil), "WithErrorType(nil)"},
		{"nil propagator", nolockotel.WithPropagator(nil), "WithPropagator(nil)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := nolockotel.New(tc.opt)
			if !errors.Is(err, nolockotel.ErrInvalid) || !strings.Contains(err.Error(), tc.want) || a != nil {
				t.Errorf("New: %v, %v; want ErrInvalid naming %s", a, err, tc.want)
			}
		})
	}
	if _, err := nolockotel.New(); err != nil {
		t.Errorf("New with the global providers: %v", err)
	}
}

// WithErrorType classes errors; an empty class falls back to ErrorType's.
func TestWithErrorType(t *testing.T) {
	t.Parallel()
	mine := errors.New("mine")
	b := newBed(t, nolockotel.WithErrorType(func(err error) string {
		if errors.Is(err, mine) {
			return "app.Mine"
		}
		return ""
	}))
	b.a.Event(context.Background(), observe.Event{Name: "cas.conflict", Err: fmt.Errorf("x: %w", mine)})
	b.a.Event(context.Background(), observe.Event{Name: "cas.conflict", Err: context.Canceled})
	equalMaps(t, nolockotel.MetricOutcomes, b.collect(t).counts(t), map[string]int64{
		"cas.conflict/app.Mine":         1,
		"cas.conflict/context.Canceled": 1,
	})
}

// unexportedWrapper stands for a package's internal wrapper type.
type unexportedWrapper struct{ error }

func (e unexportedWrapper) Unwrap() error { return e.error }

func TestErrorType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("something else"), "_OTHER"},
		{errConflict, "cas.ErrConflict"},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", errConflict)), "cas.ErrConflict"},
		{context.Canceled, "context.Canceled"},
		{fmt.Errorf("a: %w", context.DeadlineExceeded), "context.DeadlineExceeded"},
		{&heldError{}, "*nolockotel_test.heldError"},
		{fmt.Errorf("%w: %w", errors.New("x"), &heldError{}), "*nolockotel_test.heldError"},
		{errors.Join(errors.New("x"), fmt.Errorf("x: %w", &heldError{})), "*nolockotel_test.heldError"},
		// A sentinel anywhere wins over a type; the first sentinel wins.
		{fmt.Errorf("%w: %w", &heldError{}, errConflict), "cas.ErrConflict"},
		{errors.Join(context.Canceled, errConflict), "context.Canceled"},
		// An unexported wrapper is looked through; one without Unwrap is named.
		{unexportedWrapper{&heldError{}}, "*nolockotel_test.heldError"},
		{unexportedWrapper{errors.New("x")}, "_OTHER"},
		{struct{ error }{errors.New("x")}, "struct { error }"},
	} {
		if got := nolockotel.ErrorType(tc.err); got != tc.want {
			t.Errorf("ErrorType(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
