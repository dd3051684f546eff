package nolockotel_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/promtext"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/observe"
)

// The Prometheus text that `nolock demo -metrics` and the example
// services serve (internal/promtext) has the same metric families as the
// adapter through OpenTelemetry's Prometheus exporter, given the same
// calls and events: names, types, label sets, bucket bounds, and each
// series' count. A dashboard built on one works on the other.
func TestPromTextMatchesAdapter(t *testing.T) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	a, err := nolockotel.New(nolockotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	text := &promtext.Counts{}
	for _, o := range []observe.Observer{a, text} {
		promWorkload(o)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := families(fams)
	var b strings.Builder
	if _, err := text.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	parsed, err := parser.TextToMetricFamilies(strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("promtext's output does not parse: %v\n%s", err, b.String())
	}
	got := families(mapValues(parsed))
	if len(got) < 8 {
		t.Fatalf("promtext served %d families, want every instrument of the workload:\n%s", len(got), b.String())
	}
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: served by the adapter, not by promtext", name)
		} else if !slices.Equal(g, w) {
			t.Errorf("%s differs:\nadapter:  %v\npromtext: %v", name, w, g)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: served by promtext, not by the adapter", name)
		}
	}
}

// promWorkload makes one of each kind of call and event, through o.
func promWorkload(o observe.Observer) {
	bg := context.Background()
	call := func(c observe.Call, events []observe.Event, end observe.Event) {
		ctx := o.Start(bg, c)
		for _, e := range events {
			o.Event(ctx, e)
		}
		o.End(ctx, end)
	}
	call(observe.Call{Name: "lease.acquire", Key: "k"}, []observe.Event{{Name: "lease.contended", Key: "k"}}, observe.Event{Name: "lease.acquired", Key: "k", Token: 1})
	call(observe.Call{Name: "lease.release", Key: "k"}, nil, observe.Event{Name: "lease.released", Key: "k", Token: 1, Duration: 2 * time.Second})
	o.Event(bg, observe.Event{Name: "lease.renewed", Key: "k", Duration: 3 * time.Millisecond})
	o.Event(bg, observe.Event{Name: "dynamolock.lost", Key: "d", Err: errors.New("gone")})
	call(observe.Call{Name: "cas.retry_op"}, []observe.Event{
		{Name: "cas.conflict", Attempt: 1},
		{Name: "cas.retry", Attempt: 1, Duration: time.Millisecond},
	}, observe.Event{Name: "cas.committed", N: 1})
	call(observe.Call{Name: "conditional.take", Key: "sku"}, nil, observe.Event{Name: "conditional.refused", Key: "sku", N: 1, Err: fmt.Errorf("take: %w", conditional.ErrSoldOut)})
	o.Event(bg, observe.Event{Name: "conditional.batch", Key: "sku#0", N: 7, Dropped: 2})
	msg := &observe.Message{Topic: "orders", Partition: 3, Offset: 41}
	call(observe.Call{Name: "inbox.handle", Key: "orders/3", Message: msg}, nil, observe.Event{Name: "inbox.handled", Key: "orders/3"})
	o.Event(bg, observe.Event{Name: "inbox.committed", Key: "orders/3", N: 5})
}

// families describes each family by name: its type, then each series'
// labels (without the OpenTelemetry scope's) and count, sorted; the
// exporter's own target_info is left out, and so is a histogram's +Inf
// bucket, which a gathered histogram leaves implicit.
func families(fams []*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	for _, f := range fams {
		if f.GetName() == "target_info" {
			continue
		}
		desc := []string{f.GetType().String()}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if !strings.HasPrefix(l.GetName(), "otel_scope_") {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			slices.Sort(labels)
			s := strings.Join(labels, ",")
			switch {
			case m.GetHistogram() != nil:
				var bounds []string
				for _, b := range m.GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) { // implicit in a gathered histogram, written in text
						bounds = append(bounds, fmt.Sprint(b.GetUpperBound()))
					}
				}
				s += fmt.Sprintf(" count=%d buckets=%s", m.GetHistogram().GetSampleCount(), strings.Join(bounds, " "))
			case m.GetCounter() != nil:
				s += fmt.Sprintf(" value=%g", m.GetCounter().GetValue())
			case m.GetGauge() != nil:
				s += fmt.Sprintf(" value=%g", m.GetGauge().GetValue())
			}
			desc = append(desc, s)
		}
		slices.Sort(desc[1:])
		out[f.GetName()] = desc
	}
	return out
}

func mapValues(m map[string]*dto.MetricFamily) []*dto.MetricFamily {
	var out []*dto.MetricFamily
	for _, f := range m {
		out = append(out, f)
	}
	return out
}
