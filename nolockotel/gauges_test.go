package nolockotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/partition"
)

// gauge returns a gauge's values by label.
func gauge[N int64 | float64](t *testing.T, m metrics, name string) map[string]N {
	t.Helper()
	out := map[string]N{}
	if m[name] == nil {
		return out
	}
	g, ok := m[name].(metricdata.Gauge[N])
	if !ok {
		t.Fatalf("%s: %T, want a Gauge", name, m[name])
	}
	for _, dp := range g.DataPoints {
		out[label(t, dp.Attributes)] = dp.Value
	}
	return out
}

// On the real PostgreSQL: parked messages are counted per table, group
// and topic; the oldest unreaped idempotency record and inbox record are
// aged from their expiry and their retention (the database's clock, so
// bounds, not exact values); a table that does not exist leaves the
// others' values in; after Unregister nothing is observed.
func TestObserveTables(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool, _ := testenv.PostgresSchema(t, 4)
	ctx := context.Background()
	in, err := inbox.New(pool, "billing")
	if err != nil {
		t.Fatal(err)
	}
	store, err := idempotency.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(in.CreateSchema(ctx), store.CreateSchema(ctx)); err != nil {
		t.Fatal(err)
	}
	parked := inbox.DefaultTable + "_parked"
	exec(t, pool, `INSERT INTO `+parked+` (group_id, topic, partition_id, "offset", headers, error, attempts)
		VALUES ('billing', 'orders', 0, 1, '[]', 'poison', 3), ('billing', 'orders', 1, 7, '[]', 'poison', 3), ('billing', 'refunds', 0, 2, '[]', 'poison', 3)`)
	exec(t, pool, `INSERT INTO `+idempotency.DefaultTable+` (scope, key, fingerprint, expires_at) VALUES
		('s', 'old', '', now() - interval '100 seconds'), ('s', 'older', '', now() - interval '200 seconds'), ('s', 'live', '', now() + interval '1 hour')`)
	exec(t, pool, `INSERT INTO `+inbox.DefaultTable+` (consumer, id, processed_at) VALUES ('billing', 'a', now() - interval '1 hour'), ('billing', 'b', now())`)

	reg, err := b.a.ObserveTables(pool, nolockotel.Tables{
		Parked:      []string{parked, "no_such_table"},
		Idempotency: []string{idempotency.DefaultTable},
		Inbox:       map[string]time.Duration{inbox.DefaultTable: 30 * time.Minute},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.collectErr(t)
	if err == nil || !strings.Contains(err.Error(), "no_such_table") {
		t.Errorf("collect: %v, want the missing table's error", err)
	}
	equalMaps(t, nolockotel.MetricParked, gauge[int64](t, m, nolockotel.MetricParked), map[string]int64{
		" messaging.consumer.group.name=billing messaging.destination.name=orders nolock.table=" + parked:  2,
		" messaging.consumer.group.name=billing messaging.destination.name=refunds nolock.table=" + parked: 1,
	})
	ages := gauge[float64](t, m, nolockotel.MetricUnreapedAge)
	if len(ages) != 2 {
		t.Errorf("%s: %v, want the idempotency and the inbox table", nolockotel.MetricUnreapedAge, ages)
	}
	// The rows were written before the collection, by the database's clock.
	if age := ages[" nolock.table="+idempotency.DefaultTable]; age < 200 || age > 200+600 {
		t.Errorf("idempotency table's unreaped age %v s, want the older record's 200 s and the test's run", age)
	}
	if age := ages[" nolock.table="+inbox.DefaultTable]; age < 1800 || age > 1800+600 {
		t.Errorf("inbox table's unreaped age %v s, want an hour less the 30 min retention", age)
	}

	exec(t, pool, `DELETE FROM `+idempotency.DefaultTable+` WHERE expires_at < now()`)
	m, _ = b.collectErr(t)
	if age, ok := gauge[float64](t, m, nolockotel.MetricUnreapedAge)[" nolock.table="+idempotency.DefaultTable]; !ok || age != 0 {
		t.Errorf("after the reap, the idempotency table's age is %v (observed %v), want 0", age, ok)
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
	m = b.collect(t)
	if n := len(gauge[int64](t, m, nolockotel.MetricParked)) + len(gauge[float64](t, m, nolockotel.MetricUnreapedAge)); n != 0 {
		t.Errorf("%d points after Unregister, want none", n)
	}

	for _, tc := range []struct {
		db     nolockotel.Querier
		tables nolockotel.Tables
		want   string
	}{
		{nil, nolockotel.Tables{Parked: []string{parked}}, "nil db"},
		{pool, nolockotel.Tables{}, "no tables"},
	} {
		if _, err := b.a.ObserveTables(tc.db, tc.tables); !errors.Is(err, nolockotel.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ObserveTables: %v, want ErrInvalid naming %q", err, tc.want)
		}
	}
}

// stats stands for a partition.Consumer.
type stats []partition.PartitionStats

func (s stats) Stats() []partition.PartitionStats { return s }

type inboxStats inbox.Stats

func (s inboxStats) Stats() inbox.Stats { return inbox.Stats(s) }

// Lags are observed per group, topic and partition; an unknown one (-1)
// is left out; a nil source is refused.
func TestObserveLag(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	c := stats{{Topic: "orders", Partition: 0, Lag: 12}, {Topic: "orders", Partition: 1, Lag: -1}, {Topic: "refunds", Partition: 2, Lag: 0}}
	if _, err := b.a.ObserveLag(nolockotel.PartitionLag("billing", c)); err != nil {
		t.Fatal(err)
	}
	equalMaps(t, nolockotel.MetricConsumerLag, gauge[int64](t, b.collect(t), nolockotel.MetricConsumerLag), map[string]int64{
		" messaging.consumer.group.name=billing messaging.destination.name=orders messaging.destination.partition.id=0 messaging.system=kafka":  12,
		" messaging.consumer.group.name=billing messaging.destination.name=refunds messaging.destination.partition.id=2 messaging.system=kafka": 0,
	})
	in := inboxStats{Partitions: []inbox.PartitionStats{{Topic: "mail", Partition: 4, Lag: 3}, {Topic: "mail", Partition: 5, Lag: -1}}}
	if _, err := b.a.ObserveLag(nolockotel.InboxLag("mailer", in)); err != nil {
		t.Fatal(err)
	}
	equalMaps(t, nolockotel.MetricConsumerLag, gauge[int64](t, b.collect(t), nolockotel.MetricConsumerLag), map[string]int64{
		" messaging.consumer.group.name=billing messaging.destination.name=orders messaging.destination.partition.id=0 messaging.system=kafka":  12,
		" messaging.consumer.group.name=billing messaging.destination.name=refunds messaging.destination.partition.id=2 messaging.system=kafka": 0,
		" messaging.consumer.group.name=mailer messaging.destination.name=mail messaging.destination.partition.id=4 messaging.system=kafka":     3,
	})
	if _, err := b.a.ObserveLag(nil); !errors.Is(err, nolockotel.ErrInvalid) {
		t.Errorf("ObserveLag(nil): %v, want ErrInvalid", err)
	}
}
