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
// Each call (a Do, an Acquire, an inbox message's handling: the
// observe.Call names) is a span, started by the Adapter's Start when the
// call begins and ended by its End, so the spans the call's callbacks
// start (pgx's, through the context the call passes them) nest under it;
// a consumer's call is a span of kind consumer whose parent is the
// producer's trace context, read from the message's headers (which
// Inject writes). The events inside a call, retries among them, are
// events of its span; events outside any call (a lock's renewals) make
// no span.
//
// Each call's duration, measured from Start to End, is recorded in the
// one histogram of its meaning: a lock's acquisition
// (nolock.lock.wait.duration), a consumer's message or batch (the
// semantic conventions' messaging.process.duration), any other call
// (nolock.operation.duration); every other event in one instrument of
// its meaning too: a lock's hold or renewal (nolock.lock.*.duration), a
// retry (nolock.retries), or any other outcome (nolock.outcomes). Each
// carries the outcome's name in the attribute nolock.event and, when it
// has an error, its name in error.type (ErrorType: the library's
// sentinels by their Go names). Locks held and batch sizes have
// instruments of their own. Gauges report what the events cannot: a
// consumer's lag per partition (ObserveLag) and, queried from the
// database at each collection, parked messages and the oldest record a
// reaper has yet to delete (ObserveTables). The constants Metric… name
// every instrument; docs/observability.md has the table, the span trees,
// the Prometheus names and a dashboard whose queries the suite runs
// against a real Prometheus.
//
// Metric attributes are bounded: a lock's, stock's or idempotency key is
// never one (it is on spans and span events only, as nolock.key).
//
// Use it when your programs export telemetry with OpenTelemetry. When they
// log, or use another metrics library, an observe.Observer of your own is a
// few lines (docs/observability.md shows one).
package nolockotel
