package partition_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// A worker's life reaches the observer, in order: claimed, each batch
// committed (the messages they carry add up to those applied), a retry and
// a parked poison message, released when Run stops. A panicking observer
// breaks nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	const n, poison = 30, "0-12"
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, n)
	rec := &testenv.Events{}
	rec2 := &testenv.Events{}
	apply := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs {
			if string(m.Value) == poison {
				return errors.New("poison")
			}
		}
		return apply(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(2), partition.WithObserver(observe.Func(rec.Observe)),
		partition.WithObserver(observe.Func(rec2.Observe))) // the last one counts
	cfg.with(partition.WithObserver(observe.Func(func(ctx context.Context, e observe.Event) {
		rec.Observe(ctx, e)
		panic("a broken observer")
	})))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(context.Background(), b.pool, n-1); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	key := b.topic + "/0"
	names := slices.Compact(rec.Names(key))
	if names[0] != partition.EventClaimed || names[len(names)-1] != partition.EventReleased {
		t.Errorf("events %v: want claimed first and released last", names)
	}
	var applied int64
	for _, e := range rec.Of(key, partition.EventCommitted) {
		applied += e.N
		if e.Token < 1 || e.Attempt < 1 {
			t.Errorf("committed event %+v: want the epoch and the attempt", e)
		}
	}
	if applied != n-1 {
		t.Errorf("committed events carry %d messages, want %d (all but the parked one)", applied, n-1)
	}
	// A busy machine's transient failures may add retries of their own:
	// the poison's first attempt on its own is one retry of one message.
	poisonRetries := 0
	for _, e := range rec.Of(key, partition.EventRetry) {
		if e.N == 1 && e.Attempt == 1 && e.Err != nil && strings.Contains(e.Err.Error(), "poison") {
			poisonRetries++
		}
	}
	if poisonRetries != 1 {
		t.Errorf("retry events %+v: want one after the poison's first attempt on its own", rec.Of(key, partition.EventRetry))
	}
	if p := rec.Of(key+"@12", partition.EventParked); len(p) != 1 || p[0].N != 1 || p[0].Attempt != 2 || p[0].Err == nil {
		t.Errorf("parked events of offset 12 %+v: want one, after 2 attempts, with the error", p)
	}
	if r := rec.Errs(key, partition.EventReleased); len(r) != 1 || r[0] != nil {
		t.Errorf("released events' errors %v: want one nil", r)
	}
	if got := rec2.Names(key); len(got) != 0 {
		t.Errorf("an observer replaced by a later WithObserver got %v", got)
	}
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{partition.EventClaimed, "partition.claimed"},
		{partition.EventCommitted, "partition.committed"},
		{partition.EventRetry, "partition.retry"},
		{partition.EventParked, "partition.parked"},
		{partition.EventFenced, "partition.fenced"},
		{partition.EventReleased, "partition.released"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
