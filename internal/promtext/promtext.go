// Package promtext is an observe.Observer that keeps the instruments of
// package telemetry and writes them in Prometheus's text format (0.0.4),
// under the names, units, labels and buckets the OpenTelemetry adapter
// (module nolockotel) has once its Prometheus exporter translates them
// (nolockotel's TestPromTextMatchesAdapter compares the two). It serves
// `nolock demo -metrics`, `nolock bench -metrics` and the example
// services' /metrics, without OpenTelemetry in the library's module.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nolock/nolock/internal/telemetry"
	"github.com/nolock/nolock/observe"
)

// Counts is the Observer: pass it to every package's WithObserver. The
// zero value is ready to use; a Counts is safe for concurrent use.
type Counts struct {
	mu       sync.Mutex
	families map[string]*family // by Prometheus name
}

type family struct {
	in     telemetry.Instrument
	series map[string]*series // by rendered labels
}

type series struct {
	buckets []uint64 // histograms: counts per bound, not cumulative
	count   uint64
	sum     float64 // histograms: the sum; counters and gauges: the value
}

type callKey struct{}

// call is a call in flight, from Start to End.
type call struct {
	name    string
	start   time.Time
	message *observe.Message
	ended   atomic.Bool
}

// Start records when the call began.
func (c *Counts) Start(ctx context.Context, call0 observe.Call) context.Context {
	return context.WithValue(ctx, callKey{}, &call{name: call0.Name, start: time.Now(), message: call0.Message})
}

// End records the call's duration in the histogram of its meaning, with
// e's other measures. An End without this Counts' Start counts e as Event
// does.
func (c *Counts) End(ctx context.Context, e observe.Event) {
	cl, _ := ctx.Value(callKey{}).(*call)
	if cl == nil || cl.ended.Swap(true) {
		c.Event(ctx, e)
		return
	}
	in := telemetry.OfCall(cl.name, cl.message != nil)
	labels := append(eventLabels(e), "nolock_call", cl.name)
	if in == telemetry.ProcessDuration {
		labels = append(labels,
			"messaging_destination_name", cl.message.Topic,
			"messaging_destination_partition_id", strconv.Itoa(cl.message.Partition),
			"messaging_operation_name", "process", "messaging_system", "kafka")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.observe(in, labels, time.Since(cl.start).Seconds())
	c.measures(e)
}

// Event counts e in the instrument of its meaning, with its other
// measures.
func (c *Counts) Event(_ context.Context, e observe.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in, ok := telemetry.OfEvent(e.Name); ok {
		v := 1.0
		if in.Kind == telemetry.Histogram {
			v = e.Duration.Seconds()
		}
		c.observe(in, eventLabels(e), v)
	}
	c.measures(e)
}

// measures records what e carries besides its count or duration; c.mu
// is held.
func (c *Counts) measures(e observe.Event) {
	if e.Dropped > 0 {
		c.observe(telemetry.Dropped, nil, float64(e.Dropped))
	}
	m := telemetry.MeasuresOf(e)
	if m.Hold {
		c.observe(telemetry.LockHold, eventLabels(e), e.Duration.Seconds())
	}
	if m.Held != 0 {
		pattern, _, _ := strings.Cut(e.Name, ".")
		c.observe(telemetry.LocksHeld, []string{"nolock_pattern", pattern}, float64(m.Held))
	}
	if m.Batch {
		c.observe(telemetry.BatchSize, eventLabels(e), float64(e.N))
	}
}

// eventLabels are an event's labels: its name and error type.
func eventLabels(e observe.Event) []string {
	l := []string{"nolock_event", e.Name}
	if e.Err != nil {
		l = append(l, "error_type", telemetry.ErrorType(e.Err))
	}
	return l
}

// observe adds v to in's series of labels (name, value pairs); c.mu is
// held.
func (c *Counts) observe(in telemetry.Instrument, labels []string, v float64) {
	name := telemetry.PromName(in)
	if c.families == nil {
		c.families = map[string]*family{}
	}
	f := c.families[name]
	if f == nil {
		f = &family{in: in, series: map[string]*series{}}
		c.families[name] = f
	}
	key := render(labels)
	s := f.series[key]
	if s == nil {
		s = &series{}
		if in.Kind == telemetry.Histogram {
			s.buckets = make([]uint64, len(bounds(in)))
		}
		f.series[key] = s
	}
	if in.Kind != telemetry.Histogram {
		s.sum += v
		return
	}
	s.count++
	s.sum += v
	if i, _ := slices.BinarySearch(bounds(in), v); i < len(s.buckets) {
		s.buckets[i]++
	}
}

// bounds are a histogram's bucket bounds.
func bounds(in telemetry.Instrument) []float64 {
	if in.Unit == "s" {
		return telemetry.Seconds
	}
	return telemetry.Items
}

// render writes labels (name, value pairs) as Prometheus does, sorted by
// name.
func render(labels []string) string {
	type kv struct{ k, v string }
	var kvs []kv
	for i := 0; i+1 < len(labels); i += 2 {
		kvs = append(kvs, kv{labels[i], labels[i+1]})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	parts := make([]string, len(kvs))
	for i, p := range kvs {
		parts[i] = p.k + "=" + strconv.Quote(p.v)
	}
	return strings.Join(parts, ",")
}

// WriteTo writes the instruments in Prometheus's text format (0.0.4),
// families and series sorted.
func (c *Counts) WriteTo(w io.Writer) (int64, error) {
	c.mu.Lock()
	var b []byte
	names := make([]string, 0, len(c.families))
	for name := range c.families {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		f := c.families[name]
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n", name, f.in.Help, name, typeOf(f.in.Kind))
		keys := make([]string, 0, len(f.series))
		for k := range f.series {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendSeries(b, name, f.in, k, f.series[k])
		}
	}
	c.mu.Unlock()
	n, err := w.Write(b)
	return int64(n), err
}

func typeOf(k telemetry.Kind) string {
	switch k {
	case telemetry.Histogram:
		return "histogram"
	case telemetry.Counter:
		return "counter"
	}
	return "gauge"
}

// appendSeries writes one series of family name.
func appendSeries(b []byte, name string, in telemetry.Instrument, labels string, s *series) []byte {
	with := func(extra string) string {
		switch {
		case labels == "":
			return "{" + extra + "}"
		case extra == "":
			return "{" + labels + "}"
		}
		return "{" + labels + "," + extra + "}"
	}
	if in.Kind != telemetry.Histogram {
		return fmt.Appendf(b, "%s%s %g\n", name, with(""), s.sum)
	}
	var cum uint64
	for i, bound := range bounds(in) {
		cum += s.buckets[i]
		b = fmt.Appendf(b, "%s_bucket%s %d\n", name, with(`le="`+strconv.FormatFloat(bound, 'g', -1, 64)+`"`), cum)
	}
	b = fmt.Appendf(b, "%s_bucket%s %d\n", name, with(`le="+Inf"`), s.count)
	b = fmt.Appendf(b, "%s_sum%s %g\n", name, with(""), s.sum)
	return fmt.Appendf(b, "%s_count%s %d\n", name, with(""), s.count)
}

// ServeHTTP serves the instruments as a Prometheus scrape target.
func (c *Counts) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = c.WriteTo(w)
}
