package nolockotel

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/partition"
)

// Lag is one partition's consumer lag, as a source of ObserveLag reports
// it.
type Lag struct {
	Group     string // the consumer group or inbox consumer name ("" if none)
	Topic     string
	Partition int
	// Messages is how many records the consumer has not yet handled; a
	// negative value means unknown, and is not reported.
	Messages int64
}

// ObserveLag reports, at each collection of the MeterProvider's readers,
// the lags that lags returns in the gauge nolock.consumer.lag (by
// messaging.consumer.group.name, messaging.destination.name and
// messaging.destination.partition.id), until the Registration is
// unregistered. lags is called from the collecting goroutine and must be
// safe for that; PartitionLag and ReaderLag make one. A nil lags is
// refused (ErrInvalid).
func (a *Adapter) ObserveLag(lags func() []Lag) (metric.Registration, error) {
	if lags == nil {
		return nil, errfmt.Errorf("%w: ObserveLag(nil)", ErrInvalid)
	}
	return a.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, l := range lags() {
			if l.Messages < 0 {
				continue
			}
			kv := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingDestinationName(l.Topic),
				semconv.MessagingDestinationPartitionID(strconv.Itoa(l.Partition))}
			if l.Group != "" {
				kv = append(kv, semconv.MessagingConsumerGroupName(l.Group))
			}
			o.ObserveInt64(a.gauges.lag, l.Messages, metric.WithAttributes(kv...))
		}
		return nil
	}, a.gauges.lag)
}

// PartitionLag returns the lag of each partition c owns (PartitionStats'
// Lag, as of c's last fetch), for ObserveLag; group is c's consumer
// group, for the attribute. Reading it does no I/O.
func PartitionLag(group string, c interface {
	Stats() []partition.PartitionStats
}) func() []Lag {
	return func() []Lag {
		stats := c.Stats()
		out := make([]Lag, 0, len(stats))
		for _, s := range stats {
			out = append(out, Lag{Group: group, Topic: s.Topic, Partition: s.Partition, Messages: s.Lag})
		}
		return out
	}
}

// InboxLag returns the lag of each partition in in's Stats (the
// partitions it has handled messages of, each as of its last one), for
// ObserveLag; group is in's consumer name (usually the Reader's GroupID),
// for the attribute (ObserveLag leaves out a lag that is unknown, -1).
// Reading it does no I/O.
func InboxLag(group string, in interface{ Stats() inbox.Stats }) func() []Lag {
	return func() []Lag {
		stats := in.Stats().Partitions
		out := make([]Lag, 0, len(stats))
		for _, s := range stats {
			out = append(out, Lag{Group: group, Topic: s.Topic, Partition: s.Partition, Messages: s.Lag})
		}
		return out
	}
}

// ReaderLag returns the lag of a kafka-go Reader of one partition
// (Reader.Lag: as of its last message; unknown for a Reader with a
// GroupID, for which InboxLag gives an Inbox's), for ObserveLag. group
// names the consumer in the attribute. Reading it
// does no I/O and does not reset the Reader's Stats.
func ReaderLag(group string, r *kafka.Reader) func() []Lag {
	cfg := r.Config()
	return func() []Lag {
		return []Lag{{Group: group, Topic: cfg.Topic, Partition: cfg.Partition, Messages: r.Lag()}}
	}
}

// Querier is what ObserveTables needs from pgx: a pool, a connection (not
// shared with other goroutines) or anything with Query. It may grow.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Tables names the tables ObserveTables reads, each one identifier
// (quoted, found through the search_path), as given to the packages'
// WithTable options.
type Tables struct {
	// Parked are tables of parked messages: an inbox's or a partition
	// Consumer's table name + "_parked". Their rows are the gauge
	// nolock.parked.messages, by table, consumer group and topic.
	Parked []string
	// Idempotency are idempotency.Store tables. How long ago their oldest
	// expired record, which Reap has not deleted yet, expired is the gauge
	// nolock.unreaped.age (0 when none is), by table.
	Idempotency []string
	// Inbox are inbox tables, each with the retention its Reap is called
	// with: how long ago their oldest record passed it is
	// nolock.unreaped.age (0 when none did), by table.
	Inbox map[string]time.Duration
}

// ObserveTables reports, at each collection of the MeterProvider's
// readers, the parked messages and the oldest unreaped records of the
// tables t names, queried through db (one cheap query per table, each an
// index's first entry or a count of the parked table), until the
// Registration is unregistered. The queries use the collection's context:
// bound them with the pool's statement_timeout or the reader's timeout. A
// query that fails is left out of that collection and its error returned
// to the SDK (which hands it to otel.Handle). A nil db or an empty t is
// refused (ErrInvalid).
func (a *Adapter) ObserveTables(db Querier, t Tables) (metric.Registration, error) {
	if db == nil {
		return nil, errfmt.Errorf("%w: ObserveTables with a nil db", ErrInvalid)
	}
	if len(t.Parked)+len(t.Idempotency)+len(t.Inbox) == 0 {
		return nil, errfmt.Errorf("%w: ObserveTables with no tables", ErrInvalid)
	}
	return a.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var errs []error
		for _, name := range t.Parked {
			errs = append(errs, a.observeParked(ctx, db, o, name))
		}
		for _, name := range t.Idempotency {
			errs = append(errs, a.observeAge(ctx, db, o, name,
				`SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(expires_at)), 0)::float8 FROM `+quote(name)+` WHERE expires_at < now()`))
		}
		for name, retention := range t.Inbox {
			errs = append(errs, a.observeAge(ctx, db, o, name,
				`SELECT COALESCE(GREATEST(EXTRACT(EPOCH FROM now() - min(processed_at)) - $1, 0), 0)::float8 FROM `+quote(name), retention.Seconds()))
		}
		return errors.Join(errs...)
	}, a.gauges.parked, a.gauges.unreaped)
}

func quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// observeParked observes the rows of a parked table by group and topic.
func (a *Adapter) observeParked(ctx context.Context, db Querier, o metric.Observer, table string) error {
	rows, err := db.Query(ctx, `SELECT group_id, topic, count(*) FROM `+quote(table)+` GROUP BY group_id, topic`)
	if err != nil {
		return errfmt.Errorf("nolockotel: parked messages of %s: %w", table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var group, topic string
		var n int64
		if err := rows.Scan(&group, &topic, &n); err != nil {
			return errfmt.Errorf("nolockotel: parked messages of %s: %w", table, err)
		}
		o.ObserveInt64(a.gauges.parked, n, metric.WithAttributes(AttrTable.String(table),
			semconv.MessagingConsumerGroupName(group), semconv.MessagingDestinationName(topic)))
	}
	if err := rows.Err(); err != nil {
		return errfmt.Errorf("nolockotel: parked messages of %s: %w", table, err)
	}
	return nil
}

// observeAge observes the age (s) that sql returns for table.
func (a *Adapter) observeAge(ctx context.Context, db Querier, o metric.Observer, table, sql string, args ...any) error {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return errfmt.Errorf("nolockotel: unreaped records of %s: %w", table, err)
	}
	age, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[float64])
	if err != nil {
		return errfmt.Errorf("nolockotel: unreaped records of %s: %w", table, err)
	}
	o.ObserveFloat64(a.gauges.unreaped, age, metric.WithAttributes(AttrTable.String(table)))
	return nil
}

// gauges are an Adapter's asynchronous instruments, observed by the
// callbacks that ObserveLag and ObserveTables register.
type gauges struct {
	lag, parked metric.Int64ObservableGauge
	unreaped    metric.Float64ObservableGauge
}

func newGauges(meter metric.Meter) (gauges, error) {
	var g gauges
	var err1, err2, err3 error
	g.lag, err1 = meter.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{message}"),
		metric.WithDescription("Records of a partition its consumer has not handled yet."))
	g.parked, err2 = meter.Int64ObservableGauge(MetricParked, metric.WithUnit("{message}"),
		metric.WithDescription("Parked messages, by table, consumer group and topic."))
	g.unreaped, err3 = meter.Float64ObservableGauge(MetricUnreapedAge, metric.WithUnit("s"),
		metric.WithDescription("How long ago the oldest record that Reap should delete became due."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return g, errfmt.Errorf("nolockotel: gauges: %w", err)
	}
	return g, nil
}
