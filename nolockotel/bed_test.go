package nolockotel_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/nolockotel"
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
	m, err := b.collectErr(t)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// collectErr is collect that returns the callbacks' errors with what the
// reader collected.
func (b *bed) collectErr(t *testing.T) (metrics, error) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	err := b.reader.Collect(context.Background(), &rm)
	m := metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != nolockotel.ScopeName || sm.Scope.Version != nolockotel.Version || sm.Scope.SchemaURL != nolockotel.SchemaURL {
			t.Errorf("scope %+v, want %s, version %s, schema %s", sm.Scope, nolockotel.ScopeName, nolockotel.Version, nolockotel.SchemaURL)
		}
		for _, x := range sm.Metrics {
			m[x.Name] = x.Data
		}
	}
	return m, err
}

// label is a data point's nolock.event (or nolock.pattern), with "/" and
// its error.type if it has one, then its other attributes as " key=value"
// in order; attributes a metric must not carry fail the test.
func label(t *testing.T, set attribute.Set) string {
	t.Helper()
	name, ok := set.Value(nolockotel.AttrEvent)
	if !ok {
		name, _ = set.Value(nolockotel.AttrPattern)
	}
	out := name.AsString()
	if et, ok := set.Value(nolockotel.AttrErrorType); ok {
		out += "/" + et.AsString()
	}
	for _, kv := range set.ToSlice() {
		switch kv.Key {
		case nolockotel.AttrEvent, nolockotel.AttrCall, nolockotel.AttrPattern, nolockotel.AttrErrorType:
		case "messaging.system", "messaging.operation.name", "messaging.destination.name", "messaging.destination.partition.id",
			"messaging.consumer.group.name", nolockotel.AttrTable:
			out += " " + string(kv.Key) + "=" + kv.Value.String()
		default:
			t.Errorf("metric attribute %s=%s: not a bounded one", kv.Key, kv.Value.String())
		}
	}
	return out
}

// counts returns a counter's values by label (nolock.outcomes' by
// default).
func (m metrics) counts(t *testing.T, name ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	metricName := nolockotel.MetricOutcomes
	if len(name) > 0 {
		metricName = name[0]
	}
	sum, ok := m[metricName].(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: %T, want a Sum[int64]", metricName, m[metricName])
	}
	if sum.Temporality != metricdata.CumulativeTemporality {
		t.Errorf("%s: want a cumulative sum", metricName)
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
