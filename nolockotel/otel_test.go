package nolockotel_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
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

// Synthetic events land each in the one instrument of its meaning,
// counted exactly by name and error type; batch sizes, locks held and
// Dropped are recorded; no key reaches a metric (a consumer's topic and
// partition do, as messaging.* attributes).
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := newBed(t)
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
	obs.Event(ctx, observe.Event{Name: "partition.parked", Key: "t/0@12", Token: 2, N: 1, Attempt: 3, Err: errors.New("poison")})
	obs.Event(ctx, observe.Event{Name: "partition.committed", Key: "orders/3", Token: 2, N: 10, Duration: 200 * time.Millisecond})
	obs.Event(ctx, observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 1, Duration: 50 * time.Millisecond})
	obs.Event(ctx, observe.Event{Name: "dynamolock.acquired", Key: "k", Token: 1, Attempt: 1, Duration: 25 * time.Millisecond})
	obs.Event(ctx, observe.Event{Name: "dynamolock.acquired", Key: "k2", Token: 1, Attempt: 1, Duration: 25 * time.Millisecond})
	obs.Event(ctx, observe.Event{Name: "dynamolock.lost", Key: "k2", Token: 1, Err: fmt.Errorf("lost: %w", errors.New("dynamolock: lock lost"))})
	obs.Event(ctx, observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Duration: time.Second,
		Err: fmt.Errorf("lease: not acquired: %w", &heldError{"other"})})
	obs.Event(ctx, observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Duration: time.Second,
		Err: fmt.Errorf("wait: %w", context.DeadlineExceeded)})
	obs.Event(ctx, observe.Event{Name: "lease.renewed", Key: "k", Token: 9, Duration: 2 * time.Millisecond, Dropped: 4})
	obs.Event(ctx, observe.Event{Name: "lease.released", Key: "k", Token: 9, Duration: 3 * time.Second})
	obs.Event(ctx, observe.Event{Name: "idempotency.replayed", Key: "order-1", Duration: 4 * time.Millisecond})

	m := b.collect(t)
	equalMaps(t, nolockotel.MetricOutcomes, m.counts(t), map[string]int64{
		"cas.conflict/cas.ErrConflict":           3,
		"cas.committed":                          2,
		"conditional.batch":                      1,
		"partition.parked/_OTHER":                1,
		"dynamolock.lost/dynamolock.ErrLockLost": 1,
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
		nolockotel.MetricLockRenewal:       {"lease.renewed": {1, 0.002}},
		nolockotel.MetricLockHold:          {"lease.released": {1, 3}},
		nolockotel.MetricOperationDuration: {"idempotency.replayed": {1, 0.004}},
		nolockotel.MetricProcessDuration: {
			"partition.committed messaging.destination.name=orders messaging.destination.partition.id=3 messaging.operation.name=process messaging.system=kafka": {1, 0.2},
		},
	} {
		equalMaps(t, name+" (count, sum)", histogram[float64](t, m, name), want)
	}
	equalMaps(t, "nolock.batch.size (count, sum)", histogram[int64](t, m, nolockotel.MetricBatchSize), map[string][2]float64{
		"cas.committed":       {2, 8},
		"conditional.batch":   {1, 7},
		"partition.committed": {1, 10},
	})
}

// An event with a Duration is a span under the caller's, ending now and
// starting Duration earlier; with an error, the span's status is Error.
// A retry, and an event without a Duration, is an event of the caller's
// span (a retry's with its wait), or nothing when no span is recording:
// no span ends in the future.
func TestSpans(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, caller := b.tp.Tracer("test").Start(context.Background(), "caller")
	before := time.Now()
	b.a.Observe(ctx, observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 2, Duration: 50 * time.Millisecond})
	b.a.Observe(ctx, observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 1, Duration: 20 * time.Millisecond, Err: context.DeadlineExceeded})
	b.a.Observe(ctx, observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})
	b.a.Observe(ctx, observe.Event{Name: "cas.retry", Attempt: 1, Duration: 20 * time.Millisecond, Err: errConflict})
	caller.End()
	after := time.Now()
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans.Ended() {
		spans[s.Name()] = s
		if s.EndTime().After(after) {
			t.Errorf("span %s ends at %v, after the test's %v", s.Name(), s.EndTime(), after)
		}
	}
	if len(spans) != 3 {
		t.Fatalf("spans %v: want caller, lease.acquired and lease.not_acquired", spans)
	}
	parent := spans["caller"]
	for _, name := range []string{"lease.acquired", "lease.not_acquired"} {
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
	acq := spans["lease.acquired"]
	if acq.EndTime().Before(before) || acq.EndTime().Sub(acq.StartTime()) != 50*time.Millisecond {
		t.Errorf("lease.acquired from %v to %v: want 50ms ending between %v and %v", acq.StartTime(), acq.EndTime(), before, after)
	}
	wantAttrs(t, "lease.acquired", acq.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("lease.acquired"), nolockotel.AttrKey: attribute.StringValue("k"),
		nolockotel.AttrToken: attribute.Int64Value(9), nolockotel.AttrAttempt: attribute.IntValue(2),
	})
	if acq.Status().Code != codes.Unset {
		t.Errorf("lease.acquired status %v, want unset", acq.Status())
	}
	not := spans["lease.not_acquired"]
	if not.Status().Code != codes.Error || not.Status().Description != context.DeadlineExceeded.Error() {
		t.Errorf("lease.not_acquired status %+v, want Error with the error's text", not.Status())
	}
	wantAttrs(t, "lease.not_acquired", not.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("lease.not_acquired"), nolockotel.AttrKey: attribute.StringValue("k"),
		nolockotel.AttrAttempt: attribute.IntValue(1), nolockotel.AttrErrorType: attribute.StringValue("context.DeadlineExceeded"),
	})
	events := parent.Events()
	if len(events) != 2 || events[0].Name != "cas.conflict" || events[1].Name != "cas.retry" {
		t.Fatalf("caller's span events %+v: want cas.conflict, cas.retry", events)
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
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Err: fmt.Errorf("x: %w", mine)})
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Err: context.Canceled})
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
