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
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/observe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bed is an Adapter on in-memory providers: a manual metric reader and a
// span recorder.
type bed struct {
	a      *nolockotel.Adapter
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newBed(t *testing.T, opts ...nolockotel.Option) *bed {
	t.Helper()
	b := &bed{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	b.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = b.tp.Shutdown(context.Background())
	})
	a, err := nolockotel.New(append([]nolockotel.Option{nolockotel.WithMeterProvider(mp), nolockotel.WithTracerProvider(b.tp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	b.a = a
	return b
}

// metrics is what the reader collected, by instrument name.
type metrics map[string]metricdata.Aggregation

func (b *bed) collect(t *testing.T) metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	m := metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != nolockotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, nolockotel.ScopeName)
		}
		for _, x := range sm.Metrics {
			m[x.Name] = x.Data
		}
	}
	return m
}

// label is a data point's nolock.event, with "/" and its error.type if
// it has one.
func label(t *testing.T, set attribute.Set) string {
	t.Helper()
	for _, kv := range set.ToSlice() {
		switch kv.Key {
		case nolockotel.AttrEvent, nolockotel.AttrErrorType:
		default:
			t.Errorf("metric attribute %s=%s: only nolock.event and error.type are allowed", kv.Key, kv.Value.String())
		}
	}
	name, _ := set.Value(nolockotel.AttrEvent)
	if et, ok := set.Value(nolockotel.AttrErrorType); ok {
		return name.AsString() + "/" + et.AsString()
	}
	return name.AsString()
}

// counts returns nolock.events' values by label.
func (m metrics) counts(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	sum, ok := m[nolockotel.MetricEvents].(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: %T, want a Sum[int64]", nolockotel.MetricEvents, m[nolockotel.MetricEvents])
	}
	if !sum.IsMonotonic || sum.Temporality != metricdata.CumulativeTemporality {
		t.Errorf("%s: want a monotonic cumulative sum", nolockotel.MetricEvents)
	}
	for _, dp := range sum.DataPoints {
		out[label(t, dp.Attributes)] += dp.Value
	}
	return out
}

// byEvent sums counts over error types.
func byEvent(counts map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range counts {
		name, _, _ := strings.Cut(k, "/")
		out[name] += v
	}
	return out
}

// histogram returns a histogram's (count, sum) by label.
func histogram[N int64 | float64](t *testing.T, m metrics, name string) map[string][2]float64 {
	t.Helper()
	h, ok := m[name].(metricdata.Histogram[N])
	if !ok {
		t.Fatalf("%s: %T, want a Histogram", name, m[name])
	}
	out := map[string][2]float64{}
	for _, dp := range h.DataPoints {
		out[label(t, dp.Attributes)] = [2]float64{float64(dp.Count), float64(dp.Sum)}
	}
	return out
}

func equalMaps[V comparable](t *testing.T, what string, got, want map[string]V) {
	t.Helper()
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s[%s] = %v, want %v", what, k, got[k], w)
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s[%s] = %v, want none", what, k, g)
		}
	}
}

// heldError stands for a typed error of the library (*lease.HeldError).
type heldError struct{ holder string }

func (e *heldError) Error() string { return "held by " + e.holder }

var errConflict = errors.New("cas: version conflict") // a sentinel

// Synthetic events are counted exactly, by name and error type; durations
// and batch sizes go to their histograms (a parked message, N 1, does
// not); Dropped is counted; no key reaches a metric.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx := context.Background()
	obs := observe.Observer(b.a.Observe)
	for i := range 3 {
		obs.Notify(ctx, observe.Event{Name: "cas.conflict", Key: fmt.Sprint("doc-", i), Attempt: i + 1, Err: fmt.Errorf("update: %w", errConflict)})
	}
	for range 2 {
		obs.Notify(ctx, observe.Event{Name: "cas.retry", Key: "doc", Attempt: 1, Duration: 10 * time.Millisecond, Err: errConflict})
	}
	obs.Notify(ctx, observe.Event{Name: "cas.committed", Key: "doc", N: 5})
	obs.Notify(ctx, observe.Event{Name: "cas.committed", Key: "doc", N: 3})
	obs.Notify(ctx, observe.Event{Name: "conditional.batch", Key: "sku", N: 7})
	obs.Notify(ctx, observe.Event{Name: "partition.parked", Key: "t/0@12", Token: 2, N: 1, Attempt: 3, Err: errors.New("poison")})
	obs.Notify(ctx, observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 1, Duration: 50 * time.Millisecond})
	obs.Notify(ctx, observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Duration: time.Second,
		Err: fmt.Errorf("lease: not acquired: %w", &heldError{"other"})})
	obs.Notify(ctx, observe.Event{Name: "lease.not_acquired", Key: "k", Attempt: 2, Duration: time.Second,
		Err: fmt.Errorf("wait: %w", context.DeadlineExceeded)})
	obs.Notify(ctx, observe.Event{Name: "lease.renewed", Key: "k", Token: 9, Duration: 2 * time.Millisecond, Dropped: 4})

	m := b.collect(t)
	equalMaps(t, "nolock.events", m.counts(t), map[string]int64{
		"cas.conflict/_OTHER":     3,
		"cas.retry/_OTHER":        2,
		"cas.committed":           2,
		"conditional.batch":       1,
		"partition.parked/_OTHER": 1,
		"lease.acquired":          1,
		"lease.not_acquired/*nolockotel_test.heldError": 1,
		"lease.not_acquired/context.DeadlineExceeded":   1,
		"lease.renewed": 1,
	})
	dropped, ok := m[nolockotel.MetricDropped].(metricdata.Sum[int64])
	if !ok || len(dropped.DataPoints) != 1 || dropped.DataPoints[0].Value != 4 {
		t.Errorf("%s: %+v, want one point of 4", nolockotel.MetricDropped, m[nolockotel.MetricDropped])
	}
	equalMaps(t, "nolock.operation.duration (count, sum)", histogram[float64](t, m, nolockotel.MetricDuration), map[string][2]float64{
		"cas.retry/_OTHER": {2, 0.02},
		"lease.acquired":   {1, 0.05},
		"lease.not_acquired/*nolockotel_test.heldError": {1, 1},
		"lease.not_acquired/context.DeadlineExceeded":   {1, 1},
		"lease.renewed": {1, 0.002},
	})
	equalMaps(t, "nolock.batch.size (count, sum)", histogram[int64](t, m, nolockotel.MetricBatchSize), map[string][2]float64{
		"cas.committed":     {2, 8},
		"conditional.batch": {1, 7},
	})
}

// An event with a Duration is a span under the caller's, ending now and
// starting Duration earlier (a retry's wait starts now); with an error,
// the span's status is Error. An event without one is an event of the
// caller's span, or nothing when no span is recording.
func TestSpans(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	ctx, caller := b.tp.Tracer("test").Start(context.Background(), "caller")
	before := time.Now()
	b.a.Observe(ctx, observe.Event{Name: "lease.acquired", Key: "k", Token: 9, Attempt: 2, Duration: 50 * time.Millisecond})
	b.a.Observe(ctx, observe.Event{Name: "cas.retry", Attempt: 1, Duration: 20 * time.Millisecond, Err: errConflict})
	b.a.Observe(ctx, observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})
	after := time.Now()
	caller.End()
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Key: "doc", Attempt: 1, Err: errConflict})

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans.Ended() {
		spans[s.Name()] = s
	}
	if len(spans) != 3 {
		t.Fatalf("spans %v: want caller, lease.acquired and cas.retry", spans)
	}
	parent := spans["caller"]
	for _, name := range []string{"lease.acquired", "cas.retry"} {
		s := spans[name]
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s's parent %v, want the caller's span %v", name, s.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("%s: kind %v, want internal", name, s.SpanKind())
		}
	}
	acq := spans["lease.acquired"]
	if acq.EndTime().Before(before) || acq.EndTime().After(after) || acq.EndTime().Sub(acq.StartTime()) != 50*time.Millisecond {
		t.Errorf("lease.acquired from %v to %v: want 50ms ending between %v and %v", acq.StartTime(), acq.EndTime(), before, after)
	}
	wantAttrs(t, "lease.acquired", acq.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("lease.acquired"), nolockotel.AttrKey: attribute.StringValue("k"),
		nolockotel.AttrToken: attribute.Int64Value(9), nolockotel.AttrAttempt: attribute.IntValue(2),
	})
	if acq.Status().Code != codes.Unset {
		t.Errorf("lease.acquired status %v, want unset", acq.Status())
	}
	retry := spans["cas.retry"]
	if retry.StartTime().Before(before) || retry.StartTime().After(after) || retry.EndTime().Sub(retry.StartTime()) != 20*time.Millisecond {
		t.Errorf("cas.retry from %v to %v: want a 20ms wait starting between %v and %v", retry.StartTime(), retry.EndTime(), before, after)
	}
	if retry.Status().Code != codes.Error || retry.Status().Description != errConflict.Error() {
		t.Errorf("cas.retry status %+v, want Error with the error's text", retry.Status())
	}
	wantAttrs(t, "cas.retry", retry.Attributes(), map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("cas.retry"), nolockotel.AttrAttempt: attribute.IntValue(1),
		nolockotel.AttrErrorType: attribute.StringValue("_OTHER"),
	})
	events := parent.Events()
	if len(events) != 1 || events[0].Name != "cas.conflict" {
		t.Fatalf("caller's span events %+v: want one cas.conflict", events)
	}
	wantAttrs(t, "the cas.conflict span event", events[0].Attributes, map[attribute.Key]attribute.Value{
		nolockotel.AttrEvent: attribute.StringValue("cas.conflict"), nolockotel.AttrKey: attribute.StringValue("doc"),
		nolockotel.AttrAttempt: attribute.IntValue(1), nolockotel.AttrErrorType: attribute.StringValue("_OTHER"),
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
	b := newBed(t, nolockotel.WithErrorType(func(err error) string {
		if errors.Is(err, errConflict) {
			return "cas.ErrConflict"
		}
		return ""
	}))
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Err: fmt.Errorf("x: %w", errConflict)})
	b.a.Observe(context.Background(), observe.Event{Name: "cas.conflict", Err: context.Canceled})
	equalMaps(t, "nolock.events", b.collect(t).counts(t), map[string]int64{
		"cas.conflict/cas.ErrConflict":  1,
		"cas.conflict/context.Canceled": 1,
	})
}

func TestErrorType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errConflict, "_OTHER"},
		{fmt.Errorf("a: %w", fmt.Errorf("b: %w", errConflict)), "_OTHER"},
		{context.Canceled, "context.Canceled"},
		{fmt.Errorf("a: %w", context.DeadlineExceeded), "context.DeadlineExceeded"},
		{&heldError{}, "*nolockotel_test.heldError"},
		{fmt.Errorf("%w: %w", errConflict, &heldError{}), "*nolockotel_test.heldError"},
		{errors.Join(errConflict, fmt.Errorf("x: %w", &heldError{})), "*nolockotel_test.heldError"},
	} {
		if got := nolockotel.ErrorType(tc.err); got != tc.want {
			t.Errorf("ErrorType(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
