// Package nolockotel turns the events of nolock's packages (package
// observe) into OpenTelemetry metrics and spans. It is a Go module of its
// own, github.com/nolock/nolock/nolockotel, so the library's module does not
// depend on OpenTelemetry.
//
// Create one Adapter with New and pass its Adapter to every
// package's WithObserver option:
//
//	a, err := nolockotel.New() // the global MeterProvider, TracerProvider and propagator
//	locks, err := lease.New(pool, lease.WithObserver(a))
//	store, err := cas.NewStore[Doc](backend, nil, cas.WithObserver(a))
//
// Each event is recorded in the one instrument of its meaning: a call's
// duration (nolock.operation.duration), a lock's wait, hold or renewal
// (nolock.lock.*.duration), a consumer's batch (the semantic conventions'
// messaging.process.duration), a retry (nolock.retries), or any other
// outcome (nolock.outcomes), with the event's name in the attribute
// nolock.event and, when it carries an error, its name in error.type
// (ErrorType: the library's sentinels by their Go names). Locks held and
// batch sizes have instruments of their own. Gauges report what the
// events cannot: a consumer's lag per partition (ObserveLag) and, queried
// from the database at each collection, parked messages and the oldest
// record a reaper has yet to delete (ObserveTables). The constants
// Metric… name every instrument; docs/observability.md has the table,
// the Prometheus names and a dashboard whose queries the suite runs
// against a real Prometheus.
//
// An event with a Duration becomes a span named after the event, a child
// of the span in the context the package passed the observer (the
// caller's: start a span around a call and the library's spans nest
// under it); other events, retries among them, are added to the caller's
// span as span events when it is recording. Inject and Extract carry a
// trace through a Kafka message's headers.
//
// Metric attributes are bounded: a lock's, stock's or idempotency key is
// never one (it is on spans and span events only, as nolock.key).
//
// Use it when your programs export telemetry with OpenTelemetry. When they
// log, or use another metrics library, an observe.Observer of your own is a
// few lines (docs/observability.md shows one).
package nolockotel
