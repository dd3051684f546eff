package nolockotel

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/telemetry"
)

// The instruments' names. Each has one meaning; a call's End is counted
// by exactly one of MetricOperationDuration, MetricLockWait and
// MetricProcessDuration (its duration, measured from its Start), and
// every other event by exactly one of MetricLockRenewal, MetricLockHold,
// MetricRetries and MetricOutcomes (docs/observability.md has the
// table).
const (
	// MetricOperationDuration is the histogram (s) of calls' durations,
	// from the Adapter's Start to its End, by AttrCall (the call:
	// conditional.take, conditional.debit, …), AttrEvent (its outcome,
	// e.g. idempotency.replayed, cas.committed, lease.released) and
	// AttrErrorType: every call but a lock's acquisition
	// (MetricLockWait) and a consumer's (MetricProcessDuration).
	MetricOperationDuration = "nolock.operation.duration"
	// MetricLockWait is the histogram (s) of Acquire and TryAcquire calls'
	// durations (their waits), from Start to End, by AttrEvent (lease.acquired, dynamolock.not_acquired, …) and
	// AttrErrorType.
	MetricLockWait = "nolock.lock.wait.duration"
	// MetricLockHold is the histogram (s) of how long locks were held,
	// from acquisition to Release, by AttrEvent (lease.released,
	// dynamolock.released).
	MetricLockHold = "nolock.lock.hold.duration"
	// MetricLockRenewal is the histogram (s) of lock renewals' round
	// trips, by AttrEvent (lease.renewed, lease.renew_failed, …) and
	// AttrErrorType. Renewals are background work: no call waits on them.
	MetricLockRenewal = "nolock.lock.renewal.duration"
	// MetricLocksHeld is the up/down counter ({lock}) of locks held, by
	// AttrPattern (lease, dynamolock): +1 per acquired, -1 per released
	// and per lost.
	MetricLocksHeld = "nolock.lock.held"
	// MetricProcessDuration is OpenTelemetry's messaging.process.duration
	// (s): a consumer's call, from Start to End (partition.handle: a
	// batch, all its attempts; inbox.handle: a handler's run on one
	// message), by AttrEvent (its outcome: partition.committed,
	// inbox.handled, …),
	// messaging.system, messaging.operation.name (process),
	// messaging.destination.name and messaging.destination.partition.id.
	MetricProcessDuration = "messaging.process.duration"
	// MetricBatchSize is the histogram ({item}) of the sizes of batches
	// written in one statement or transaction, by AttrEvent: N of
	// cas.committed, conditional.batch, partition.committed and
	// inbox.committed.
	MetricBatchSize = "nolock.batch.size"
	// MetricRetries counts retries ({retry}), by AttrEvent (cas.retry,
	// partition.retry, inbox.retry) and AttrErrorType: an attempt failed
	// and another follows after a wait.
	MetricRetries = "nolock.retries"
	// MetricOutcomes counts ({event}) the events that are no call's End,
	// no retry, renewal or release, by AttrEvent and AttrErrorType
	// (cas.conflict, partition.parked, lease.lost, a Store's
	// cas.committed, inbox.committed, partition.released,
	// dynamolock.takeover, …).
	MetricOutcomes = "nolock.outcomes"
	// MetricDropped counts events ({event}) a package dropped because its
	// observer fell behind or panicked (Event.Dropped), without attributes.
	MetricDropped = "nolock.observer.dropped"
	// MetricConsumerLag is the gauge ({message}) of a consumer's lag per
	// partition (see ObserveLag).
	MetricConsumerLag = "nolock.consumer.lag"
	// MetricParked is the gauge ({message}) of parked messages per
	// table and topic (see ObserveTables).
	MetricParked = "nolock.parked.messages"
	// MetricUnreapedAge is the gauge (s) of how long ago the oldest
	// record of a table that its reaper should have deleted expired, 0
	// when none is due (see ObserveTables).
	MetricUnreapedAge = "nolock.unreaped.age"
)

// The attributes' keys. Metrics carry only AttrEvent, AttrCall, AttrPattern,
// AttrErrorType, AttrTable and the messaging.* attributes of topics and
// partitions: all bounded.
const (
	AttrEvent     = attribute.Key("nolock.event")   // the event's name
	AttrCall      = attribute.Key("nolock.call")    // a call's name (observe.Call.Name): the call durations' histograms
	AttrPattern   = attribute.Key("nolock.pattern") // the event name's package: lease, dynamolock, inbox, …
	AttrTable     = attribute.Key("nolock.table")   // a table's name (ObserveTables)
	AttrErrorType = semconv.ErrorTypeKey            // the error's class (see ErrorType): metrics, spans
	AttrKey       = attribute.Key("nolock.key")     // Event.Key: spans and span events only
	AttrToken     = attribute.Key("nolock.token")   // Event.Token, when not 0
	AttrAttempt   = attribute.Key("nolock.attempt") // Event.Attempt, when not 0
	AttrN         = attribute.Key("nolock.n")       // Event.N, when not 0
	attrErrorMsg  = attribute.Key("error.message")  // span events: Err's text
)

// SchemaURL is the OpenTelemetry semantic conventions' schema the
// Adapter's attributes follow (those of go.opentelemetry.io/otel's
// semconv/v1.43.0), set on its meter and tracer.
const SchemaURL = semconv.SchemaURL

// Version is the instrumentation scope's version: this module's, set at
// each release.
const Version = "0.1.0"

// instruments are an Adapter's synchronous instruments.
type instruments struct {
	operation, lockWait, lockHold, lockRenewal, process metric.Float64Histogram
	batch                                               metric.Int64Histogram
	retries, outcomes, dropped                          metric.Int64Counter
	held                                                metric.Int64UpDownCounter
}

// newInstruments creates the instruments on meter, as package telemetry
// defines them (names, units, buckets), which the example services' and
// the CLI's Prometheus text follow too.
func newInstruments(meter metric.Meter) (*instruments, error) {
	var in instruments
	var errs []error
	hist := func(t telemetry.Instrument) metric.Float64Histogram {
		h, err := meter.Float64Histogram(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Help),
			metric.WithExplicitBucketBoundaries(telemetry.Seconds...))
		errs = append(errs, err)
		return h
	}
	count := func(t telemetry.Instrument) metric.Int64Counter {
		c, err := meter.Int64Counter(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Help))
		errs = append(errs, err)
		return c
	}
	in.operation = hist(telemetry.OperationDuration)
	in.lockWait = hist(telemetry.LockWait)
	in.lockHold = hist(telemetry.LockHold)
	in.lockRenewal = hist(telemetry.LockRenewal)
	in.process = hist(telemetry.ProcessDuration)
	t := telemetry.BatchSize
	b, err := meter.Int64Histogram(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Help),
		metric.WithExplicitBucketBoundaries(telemetry.Items...))
	in.batch, errs = b, append(errs, err)
	in.retries = count(telemetry.Retries)
	in.outcomes = count(telemetry.Outcomes)
	in.dropped = count(telemetry.Dropped)
	t = telemetry.LocksHeld
	h, err := meter.Int64UpDownCounter(t.Name, metric.WithUnit(t.Unit), metric.WithDescription(t.Help))
	in.held, errs = h, append(errs, err)
	for _, err := range errs {
		if err != nil {
			return nil, errfmt.Errorf("nolockotel: instruments: %w", err)
		}
	}
	return &in, nil
}
