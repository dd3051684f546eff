package partition_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// parkedRow is one row of the parked table.
type parkedRow struct {
	partition int
	offset    int64
	value     string
	errText   string
	attempts  int
	epoch     int64
}

func readParked(ctx context.Context, pool *pgxpool.Pool, group, topic string) ([]parkedRow, error) {
	rows, err := pool.Query(ctx, `SELECT partition_id, "offset", convert_from(value, 'UTF8'), error, attempts, epoch
		FROM `+partition.DefaultTable+`_parked WHERE group_id = $1 AND topic = $2 ORDER BY partition_id, "offset"`, group, topic)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (parkedRow, error) {
		var p parkedRow
		err := r.Scan(&p.partition, &p.offset, &p.value, &p.errText, &p.attempts, &p.epoch)
		return p, err
	})
}

// parkLog records EventParked: each parked message's position (from the
// event's Key) and its last error.
type parkLog struct {
	mu   sync.Mutex
	msgs []kafka.Message
	errs []error
}

// observe is an observe.Observer.
func (l *parkLog) observe(_ context.Context, e observe.Event) {
	if e.Name != partition.EventParked {
		return
	}
	id, err := partition.ParseParkedID(e.Key)
	if err != nil {
		panic(err) // the Key is a ParkedID's String
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, kafka.Message{Topic: id.Topic, Partition: id.Partition, Offset: id.Offset})
	l.errs = append(l.errs, e.Err)
}

func (l *parkLog) snapshot() ([]kafka.Message, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]kafka.Message(nil), l.msgs...), append([]error(nil), l.errs...)
}

// One poison message in partition 1 of 4, consumed by a group of two
// members: it is parked after MaxAttempts tries on its own, in the
// transaction that moves partition 1's offset past it; every other message
// of every partition, partition 1's later ones included, is applied
// exactly once and in order; the group keeps running (both Runs return nil
// when stopped) and EventParked is reported once.
func TestPoisonIsParkedPartitionGoesOn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, per, poisonPart, poisonOff, maxAttempts = 4, 20, 1, 7, 3
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, per)
	poison := errors.New("poison message")
	var mu sync.Mutex
	poisonCalls := 0 // calls whose batch was the poison alone
	handler := func(member string) partition.Handler {
		rec := record(member)
		return func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			for _, m := range msgs {
				if m.Partition == poisonPart && m.Offset == poisonOff {
					if len(msgs) == 1 {
						mu.Lock()
						poisonCalls++
						mu.Unlock()
					}
					return poison
				}
			}
			return rec(ctx, tx, msgs)
		}
	}
	var parked parkLog
	members := make([]*member, 2)
	for i := range members {
		name := fmt.Sprintf("m%d", i)
		cfg := b.config(name, handler(name))
		cfg.with(partition.WithAttempts(maxAttempts))
		cfg.with(partition.WithObserver(observe.Func(parked.observe)))
		members[i] = startMember(t, b.pool, cfg)
	}
	if err := waitRows(ctx, b.pool, parts*per-1); err != nil {
		t.Fatal(err)
	}
	testenv.Until(t, "the poison parked", func() (bool, error) {
		msgs, _ := parked.snapshot()
		return len(msgs) > 0, nil
	})
	// Every partition's stored offset reaches its end: nothing is stuck.
	testenv.Until(t, "every stored offset at its partition's end", func() (bool, error) {
		for p := range parts {
			r, err := readRow(ctx, b.pool, b.group, b.topic, p)
			if err != nil || r.next == nil || *r.next != per {
				return false, err
			}
		}
		return true, nil
	})
	for i, m := range members {
		if err := m.stop(); err != nil {
			t.Fatalf("member %d: Run: %v; want nil", i, err)
		}
	}
	each, err := countEach(ctx, b.pool, parts, per)
	if err != nil {
		t.Fatal(err)
	}
	for p, tl := range each {
		wantMissing := 0
		if p == poisonPart {
			wantMissing = 1
		}
		if tl.dups != 0 || tl.reordered != 0 || tl.badValue != 0 || tl.missing != wantMissing || tl.rows != per-wantMissing {
			t.Errorf("partition %d: %v; want %d rows, exact but for %d missing", p, tl, per-wantMissing, wantMissing)
		}
	}
	var poisonApplied int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE partition_id = $1 AND msg_offset = $2`, poisonPart, poisonOff).Scan(&poisonApplied); err != nil || poisonApplied != 0 {
		t.Fatalf("the poison applied %d times (%v), want 0", poisonApplied, err)
	}
	rows, err := readParked(ctx, b.pool, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].partition != poisonPart || rows[0].offset != poisonOff || rows[0].value != fmt.Sprintf("%d-%d", poisonPart, poisonOff) ||
		rows[0].attempts != maxAttempts || !strings.Contains(rows[0].errText, "poison message") || rows[0].epoch < 1 {
		t.Fatalf("parked rows %+v; want one for %d/%d with %d attempts and the handler's error", rows, poisonPart, poisonOff, maxAttempts)
	}
	msgs, errs := parked.snapshot()
	if len(msgs) != 1 || msgs[0].Partition != poisonPart || msgs[0].Offset != poisonOff || !errors.Is(errs[0], poison) {
		t.Fatalf("EventParked %d times (first %v); want one, for the poison, with the handler's error", len(msgs), errs)
	}
	mu.Lock()
	defer mu.Unlock()
	if poisonCalls < maxAttempts {
		t.Fatalf("the poison was tried %d times on its own, want at least %d", poisonCalls, maxAttempts)
	}
	t.Logf("poison tried %d times on its own, parked at epoch %d", poisonCalls, rows[0].epoch)
}
