package nolockotel

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/observe"
)

// ScopeName is the instrumentation scope of the Adapter's meter and
// tracer: this module's path.
const ScopeName = "github.com/nolock/nolock/nolockotel"

// The instruments' names (see docs/observability.md).
const (
	// MetricEvents counts events (unit {event}), by nolock.event and
	// error.type.
	MetricEvents = "nolock.events"
	// MetricDropped counts events a package dropped because its observer
	// fell behind (unit {event}; Event.Dropped), without attributes.
	MetricDropped = "nolock.events.dropped"
	// MetricDuration is the histogram of events' Duration (unit s), by
	// nolock.event and error.type.
	MetricDuration = "nolock.operation.duration"
	// MetricBatchSize is the histogram of batch sizes (unit {item}), by
	// nolock.event: the N of cas.committed, conditional.batch,
	// partition.committed and inbox.committed.
	MetricBatchSize = "nolock.batch.size"
)

// The attributes' keys.
const (
	AttrEvent     = attribute.Key("nolock.event")   // the event's name: metrics, spans
	AttrErrorType = attribute.Key("error.type")     // the error's class (see WithErrorType): metrics, spans
	AttrKey       = attribute.Key("nolock.key")     // Event.Key: spans and span events only
	AttrToken     = attribute.Key("nolock.token")   // Event.Token, when not 0
	AttrAttempt   = attribute.Key("nolock.attempt") // Event.Attempt, when not 0
	AttrN         = attribute.Key("nolock.n")       // Event.N, when not 0
	attrErrorMsg  = attribute.Key("error.message")  // span events: Err's text
)

// batchEvents are the events whose N is a batch's size
// (conditional.granted's N is the units asked: not a batch).
var batchEvents = map[string]bool{"cas.committed": true, "conditional.batch": true, "partition.committed": true, "inbox.committed": true}

// ErrInvalid is returned by New for a bad option, named in the text.
var ErrInvalid = errors.New("nolockotel: invalid argument")

// Option configures New: WithMeterProvider, WithTracerProvider,
// WithErrorType.
type Option func(*config)

type config struct {
	mp        metric.MeterProvider
	tp        trace.TracerProvider
	errorType func(error) string
	bad       []string // options given nil, for New's error
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

// Adapter turns observe.Events into OpenTelemetry metrics and spans. Its
// instruments are created once, by New. It is safe for concurrent use,
// like the Observer it provides.
type Adapter struct {
	tracer    trace.Tracer
	events    metric.Int64Counter
	dropped   metric.Int64Counter
	duration  metric.Float64Histogram
	batch     metric.Int64Histogram
	errorType func(error) string
	now       func() time.Time
	// attrs caches each (event, error type)'s metric attributes; the
	// library's event names and error classes are few.
	attrs sync.Map // attrsKey -> metric.MeasurementOption
}

type attrsKey struct{ name, errorType string }

// New returns an Adapter that records on the MeterProvider and
// TracerProvider of its options (default: otel's global ones, as set when
// New is called). It refuses a nil option or provider, and returns the
// provider's error if an instrument cannot be created.
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
	meter := cfg.mp.Meter(ScopeName)
	a := &Adapter{tracer: cfg.tp.Tracer(ScopeName), errorType: cfg.errorType, now: time.Now}
	var err error
	if a.events, err = meter.Int64Counter(MetricEvents, metric.WithUnit("{event}"),
		metric.WithDescription("Events reported by nolock's packages, by event name.")); err != nil {
		return nil, errfmt.Errorf("nolockotel: %s: %w", MetricEvents, err)
	}
	if a.dropped, err = meter.Int64Counter(MetricDropped, metric.WithUnit("{event}"),
		metric.WithDescription("Events dropped because an observer fell behind.")); err != nil {
		return nil, errfmt.Errorf("nolockotel: %s: %w", MetricDropped, err)
	}
	if a.duration, err = meter.Float64Histogram(MetricDuration, metric.WithUnit("s"),
		metric.WithDescription("The Duration of nolock's events: a call's wait, a round trip, a hold, a retry's delay."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)); err != nil {
		return nil, errfmt.Errorf("nolockotel: %s: %w", MetricDuration, err)
	}
	if a.batch, err = meter.Int64Histogram(MetricBatchSize, metric.WithUnit("{item}"),
		metric.WithDescription("Sizes of the batches nolock's packages write in one statement or transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)); err != nil {
		return nil, errfmt.Errorf("nolockotel: %s: %w", MetricBatchSize, err)
	}
	return a, nil
}

// Observe records e: it is the observe.Observer to pass to every
// package's WithObserver. It counts e in nolock.events (and e.Dropped in
// nolock.events.dropped), records its Duration and batch size, and, when e
// has a Duration, ends a span named e.Name under the span in ctx (started
// e.Duration ago; for a ".retry" event, whose Duration is the wait about
// to begin, starting now and ending when the wait will); without a
// Duration, e is added as an event to the span in ctx if that span is
// recording. Observe does not block on I/O: exporting is the providers'.
func (a *Adapter) Observe(ctx context.Context, e observe.Event) {
	if ctx == nil {
		ctx = context.Background()
	}
	errType := ""
	if e.Err != nil {
		if errType = a.errorType(e.Err); errType == "" {
			errType = ErrorType(e.Err)
		}
	}
	attrs := a.metricAttrs(e.Name, errType)
	a.events.Add(ctx, 1, attrs)
	if e.Dropped > 0 {
		a.dropped.Add(ctx, e.Dropped)
	}
	if e.Duration != 0 {
		a.duration.Record(ctx, e.Duration.Seconds(), attrs)
	}
	if batchEvents[e.Name] {
		a.batch.Record(ctx, e.N, attrs)
	}
	a.trace(ctx, e, errType)
}

// metricAttrs returns the measurement option for name and errType.
func (a *Adapter) metricAttrs(name, errType string) metric.MeasurementOption {
	k := attrsKey{name, errType}
	if o, ok := a.attrs.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	kv := []attribute.KeyValue{AttrEvent.String(name)}
	if errType != "" {
		kv = append(kv, AttrErrorType.String(errType))
	}
	o, _ := a.attrs.LoadOrStore(k, metric.WithAttributeSet(attribute.NewSet(kv...)))
	return o.(metric.MeasurementOption)
}

// trace makes e a span (with a Duration) or an event of ctx's span.
func (a *Adapter) trace(ctx context.Context, e observe.Event, errType string) {
	if e.Duration == 0 {
		span := trace.SpanFromContext(ctx)
		if !span.IsRecording() {
			return
		}
		kv := spanAttrs(e, errType)
		if e.Err != nil {
			kv = append(kv, attrErrorMsg.String(e.Err.Error()))
		}
		span.AddEvent(e.Name, trace.WithAttributes(kv...))
		return
	}
	now := a.now()
	start, end := now.Add(-e.Duration), now
	if strings.HasSuffix(e.Name, ".retry") { // reported before its wait
		start, end = now, now.Add(e.Duration)
	}
	_, span := a.tracer.Start(ctx, e.Name, trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(spanAttrs(e, errType)...))
	if e.Err != nil {
		span.RecordError(e.Err, trace.WithTimestamp(end))
		span.SetStatus(codes.Error, e.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}

// spanAttrs returns e's attributes for a span or span event.
func spanAttrs(e observe.Event, errType string) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 7)
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

// ErrorType is the default class of an error for the error.type
// attribute: "context.Canceled" or "context.DeadlineExceeded" when err is
// (or wraps) one; otherwise the Go type of the first error in err's chain
// that is not a plain text or a wrapper (from errors.New, fmt.Errorf,
// errors.Join), e.g. "*lease.HeldError", "*pgconn.PgError"; otherwise
// "_OTHER" (OpenTelemetry's fallback). Sentinel errors such as
// cas.ErrConflict are plain texts, so they are "_OTHER": the event's name
// already says what happened (cas.conflict, conditional.refused); map
// them with WithErrorType to tell them apart.
func ErrorType(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	if t := namedType(err, 0); t != "" {
		return t
	}
	return "_OTHER"
}

// plain are the types of errors.New's, fmt.Errorf's (and nolock's
// errfmt.Errorf's) and errors.Join's errors: text and wrappers, not a class.
var plain = map[reflect.Type]bool{
	reflect.TypeOf(errors.New("")):                                        true,
	reflect.TypeOf(errfmt.Errorf("%w", errors.New(""))):                   true,
	reflect.TypeOf(errfmt.Errorf("%w%w", errors.New(""), errors.New(""))): true,
	reflect.TypeOf(errfmt.Errorf("a: %w", errors.New("a: b"))):            true,
	reflect.TypeOf(errors.Join(errors.New(""))):                           true,
}

// namedType returns the type of the first error in err's tree, depth
// first, that is not plain, or "" (depth bounds a cyclic tree).
func namedType(err error, depth int) string {
	if err == nil || depth > 32 {
		return ""
	}
	if !plain[reflect.TypeOf(err)] {
		return reflect.TypeOf(err).String()
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return namedType(u.Unwrap(), depth+1)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if t := namedType(e, depth+1); t != "" {
				return t
			}
		}
	}
	return ""
}
