// Package nolockotel turns the events of nolock's packages (package
// observe) into OpenTelemetry metrics and spans. It is a Go module of its
// own, github.com/nolock/nolock/nolockotel, so the library's module does not
// depend on OpenTelemetry.
//
// Create one Adapter with New and pass its Observe method to every
// package's WithObserver option:
//
//	a, err := nolockotel.New() // the global MeterProvider and TracerProvider
//	locks, err := lease.New(pool, lease.WithObserver(a.Observe))
//	store, err := cas.NewStore[Doc](backend, nil, cas.WithObserver(a.Observe))
//
// Every event adds one to the counter nolock.events, with the event's name
// in the attribute nolock.event and, when it carries an error, the
// error's class in error.type. An event with a Duration is also recorded
// in the histogram nolock.operation.duration (seconds) and becomes a span
// named after the event, a child of the span in the context the package
// passed the observer (the caller's: start a span around a call and the
// library's spans nest under it). Batch sizes go to nolock.batch.size.
// Events without a Duration are added to the caller's span as span events
// when it is recording. docs/observability.md lists the instruments, the
// attributes and which events become spans.
//
// Metric attributes are bounded: a lock's, stock's or idempotency key is
// never one (it is on spans and span events only, as nolock.key).
//
// Use it when your programs export telemetry with OpenTelemetry. When they
// log, or use another metrics library, an observe.Observer of your own is a
// few lines (docs/observability.md shows one).
package nolockotel
