package nolockotel

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/telemetry"
	"github.com/nolock/nolock/observe"
)

// ScopeName is the instrumentation scope of the Adapter's meter and
// tracer: this module's path (with Version and SchemaURL).
const ScopeName = "github.com/nolock/nolock/nolockotel"

// ErrInvalid is returned by New for a bad option, and by ObserveLag and
// ObserveTables for a bad argument, named in the text.
var ErrInvalid = errors.New("nolockotel: invalid argument")

// Option configures New: WithMeterProvider, WithTracerProvider,
// WithPropagator, WithErrorType.
type Option func(*config)

type config struct {
	mp         metric.MeterProvider
	tp         trace.TracerProvider
	errorType  func(error) string
	propagator propagation.TextMapPropagator
	bad        []string // options given nil, for New's error
}

// WithMeterProvider sets where the metrics go (default: otel's global
// MeterProvider, otel.GetMeterProvider(), at New). nil is refused.
func WithMeterProvider(p metric.MeterProvider) Option {
	return func(c *config) {
		if p == nil {
			c.bad = append(c.bad, "WithMeterProvider(nil)")
		}
		c.mp = p
	}
}

// WithTracerProvider sets where the spans go (default: otel's global
// TracerProvider, otel.GetTracerProvider(), at New). nil is refused.
func WithTracerProvider(p trace.TracerProvider) Option {
	return func(c *config) {
		if p == nil {
			c.bad = append(c.bad, "WithTracerProvider(nil)")
		}
		c.tp = p
	}
}

// WithPropagator sets the propagator Inject and Extract use (default:
// otel's global one, otel.GetTextMapPropagator(), at New; set it to
// propagation.TraceContext{} for W3C traceparent and tracestate). nil is
// refused.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) {
		if p == nil {
			c.bad = append(c.bad, "WithPropagator(nil)")
		}
		c.propagator = p
	}
}

// WithErrorType sets how an event's error becomes the error.type
// attribute (default ErrorType). f must return few distinct values: each
// is a metric series per event name. An empty result means ErrorType's.
// nil is refused.
func WithErrorType(f func(error) string) Option {
	return func(c *config) {
		if f == nil {
			c.bad = append(c.bad, "WithErrorType(nil)")
		}
		c.errorType = f
	}
}

// Adapter is an observe.Observer that turns nolock's calls and events
// into OpenTelemetry spans and metrics: pass it to every package's
// WithObserver option (lease.WithObserver(a)). Its instruments are
// created once, by New. It is safe for concurrent use.
type Adapter struct {
	tracer     trace.Tracer
	meter      metric.Meter
	in         *instruments
	gauges     gauges
	propagator propagation.TextMapPropagator
	errorType  func(error) string
	now        func() time.Time // measures calls' durations
	// attrs caches each (event, error type, key)'s metric attributes; the
	// library's event names, error classes and partitions are few.
	attrs sync.Map // attrsKey -> metric.MeasurementOption
}

// New returns an Adapter that records on the MeterProvider and
// TracerProvider, and propagates with the propagator, of its options
// (default: otel's global ones, as set when New is called), under the scope ScopeName, Version and SchemaURL. It
// refuses a nil option or provider, and returns the provider's error if
// an instrument cannot be created.
func New(opts ...Option) (*Adapter, error) {
	cfg := config{errorType: ErrorType}
	for i, o := range opts {
		if o == nil {
			return nil, errfmt.Errorf("%w: option %d is nil", ErrInvalid, i)
		}
		o(&cfg)
	}
	if len(cfg.bad) > 0 {
		return nil, errfmt.Errorf("%w: %s", ErrInvalid, strings.Join(cfg.bad, ", "))
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	if cfg.tp == nil {
		cfg.tp = otel.GetTracerProvider()
	}
	if cfg.propagator == nil {
		cfg.propagator = otel.GetTextMapPropagator()
	}
	meter := cfg.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version), metric.WithSchemaURL(SchemaURL))
	in, err := newInstruments(meter)
	if err != nil {
		return nil, err
	}
	g, err := newGauges(meter)
	if err != nil {
		return nil, err
	}
	return &Adapter{
		gauges:     g,
		tracer:     cfg.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version), trace.WithSchemaURL(SchemaURL)),
		meter:      meter,
		in:         in,
		propagator: cfg.propagator,
		errorType:  cfg.errorType,
		now:        time.Now,
	}, nil
}

// record adds e, an event that is no call's End, to the instrument of its
// meaning (telemetry.OfEvent: a retry, a renewal, or an outcome), then
// its other measures (see measures).
func (a *Adapter) record(ctx context.Context, e observe.Event, errType string) {
	attrs := a.metricAttrs(e.Name, errType, "")
	if in, ok := telemetry.OfEvent(e.Name); ok {
		switch in {
		case telemetry.Retries:
			a.in.retries.Add(ctx, 1, attrs)
		case telemetry.LockRenewal:
			a.in.lockRenewal.Record(ctx, e.Duration.Seconds(), attrs)
		default:
			a.in.outcomes.Add(ctx, 1, attrs)
		}
	}
	a.measures(ctx, e, attrs)
}

// recordCall adds call c's End, e, to its instruments: its duration d
// (measured from Start) to the one histogram of its meaning
// (telemetry.OfCall), then e's other measures.
func (a *Adapter) recordCall(ctx context.Context, c *call, e observe.Event, errType string, d time.Duration) {
	timed := a.callAttrs(c.name, e.Name, errType, "")
	switch telemetry.OfCall(c.name, c.msg != nil) {
	case telemetry.LockWait:
		a.in.lockWait.Record(ctx, d.Seconds(), timed)
	case telemetry.ProcessDuration:
		key := c.msg.Topic + "/" + strconv.Itoa(c.msg.Partition)
		a.in.process.Record(ctx, d.Seconds(), a.callAttrs(c.name, e.Name, errType, key))
	default:
		a.in.operation.Record(ctx, d.Seconds(), timed)
	}
	a.measures(ctx, e, a.metricAttrs(e.Name, errType, ""))
}

// measures records what e carries besides its own count or duration
// (telemetry.MeasuresOf): the events Dropped before it, a lock's hold and
// the locks held, a batch's size.
func (a *Adapter) measures(ctx context.Context, e observe.Event, attrs metric.MeasurementOption) {
	if e.Dropped > 0 {
		a.in.dropped.Add(ctx, e.Dropped)
	}
	m := telemetry.MeasuresOf(e)
	if m.Hold {
		a.in.lockHold.Record(ctx, e.Duration.Seconds(), attrs)
	}
	if m.Held != 0 {
		pattern, _, _ := strings.Cut(e.Name, ".")
		a.in.held.Add(ctx, m.Held, a.metricAttrs(pattern, "", ""))
	}
	if m.Batch {
		a.in.batch.Record(ctx, e.N, attrs)
	}
}

type attrsKey struct{ call, name, errorType, key string }

// metricAttrs returns the measurement option for an event's name and
// error type, with, for a consumer's key (topic/partition), the
// messaging.* attributes of its topic and partition. A name without a dot
// is a pattern: its AttrPattern alone.
func (a *Adapter) metricAttrs(name, errType, key string) metric.MeasurementOption {
	return a.callAttrs("", name, errType, key)
}

// callAttrs is metricAttrs with, for a call's duration, AttrCall: the
// call's name.
func (a *Adapter) callAttrs(call, name, errType, key string) metric.MeasurementOption {
	k := attrsKey{call, name, errType, key}
	if o, ok := a.attrs.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	var kv []attribute.KeyValue
	if !strings.Contains(name, ".") {
		kv = append(kv, AttrPattern.String(name))
	} else {
		kv = append(kv, AttrEvent.String(name))
	}
	if errType != "" {
		kv = append(kv, AttrErrorType.String(errType))
	}
	if call != "" {
		kv = append(kv, AttrCall.String(call))
	}
	if key != "" {
		kv = append(kv, semconv.MessagingSystemKafka, semconv.MessagingOperationName("process"))
		kv = append(kv, topicPartition(key)...)
	}
	o, _ := a.attrs.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(kv...)))
	return o.(metric.MeasurementOption)
}

// topicPartition returns the messaging.* attributes of a consumer
// event's Key, "topic/partition" (or "topic/partition@offset").
func topicPartition(key string) []attribute.KeyValue {
	key, _, _ = strings.Cut(key, "@")
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return []attribute.KeyValue{semconv.MessagingDestinationName(key)}
	}
	return []attribute.KeyValue{semconv.MessagingDestinationName(key[:i]), semconv.MessagingDestinationPartitionID(key[i+1:])}
}
