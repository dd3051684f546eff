package partition_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// errPoison is the error the messages parked by parkBed.park failed with.
var errPoison = errors.New("amount is not a number")

// parkBed is a partitions table, its parked table and a results table in
// a fresh schema, without Kafka: messages are parked as a worker parks
// them (partition.Park), under a claim at epoch 1 of each partition.
type parkBed struct {
	pool  *pgxpool.Pool
	group string
	topic string
	next  map[int]*int64 // each partition's stored offset
}

func newParkBed(t *testing.T) *parkBed {
	t.Helper()
	pool, _ := testenv.PostgresSchema(t, 8)
	b := &parkBed{pool: pool, group: testenv.Name("g"), topic: "transfers", next: map[int]*int64{}}
	if err := b.consumer(t).CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(context.Background(), `CREATE TABLE results (
		seq bigserial PRIMARY KEY, topic text NOT NULL, partition_id int NOT NULL,
		msg_offset bigint NOT NULL, value text NOT NULL, epoch bigint NOT NULL, member text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return b
}

// consumer is a Consumer of the bed's group. It never runs: the parked
// calls do no Kafka I/O.
func (b *parkBed) consumer(t *testing.T) *partition.Consumer {
	t.Helper()
	// A long batch timeout (the replay's bound and idle-in-transaction
	// timeout): a replay held in its handler outlasts a busy machine's
	// probes.
	c, err := partition.New(b.pool, []string{"kafka.invalid:9092"}, b.group, []string{b.topic},
		partition.WithRebalanceTimeout(2*testenv.Scale(time.Minute)), partition.WithBatchTimeout(testenv.Scale(time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// park parks the next message of partition p, with the value "p-offset",
// after attempts failures with errPoison.
func (b *parkBed) park(t *testing.T, p int, key string, headers []kafka.Header, attempts int) kafka.Message {
	t.Helper()
	ctx := context.Background()
	if b.next[p] == nil {
		if _, err := b.pool.Exec(ctx, `INSERT INTO `+partition.DefaultTable+` (group_id, topic, partition_id, epoch) VALUES ($1, $2, $3, 1)`, b.group, b.topic, p); err != nil {
			t.Fatal(err)
		}
	}
	var off int64
	if b.next[p] != nil {
		off = *b.next[p]
	}
	m := kafka.Message{Topic: b.topic, Partition: p, Offset: off, Key: []byte(key), Value: fmt.Appendf(nil, "%d-%d", p, off), Headers: headers}
	cl := partition.Claim{GroupID: b.group, Topic: b.topic, Partition: p, Epoch: 1}
	if err := partition.Park(ctx, b.consumer(t), cl, b.next[p], m, errPoison, attempts); err != nil {
		t.Fatal(err)
	}
	next := off + 1
	b.next[p] = &next
	return m
}

// listAll pages through ListParked two at a time.
func listAll(t *testing.T, c *partition.Consumer) []partition.Parked {
	t.Helper()
	var all []partition.Parked
	var after partition.ParkedID
	for {
		page, err := c.ListParked(context.Background(), after, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 2 {
			return all
		}
		after = page[len(page)-1].ID
	}
}

func parkedIDs(t *testing.T, c *partition.Consumer) string {
	t.Helper()
	var ids []string
	for _, p := range listAll(t, c) {
		ids = append(ids, p.ID.String())
	}
	return strings.Join(ids, " ")
}

// resultsFor counts the results rows of partition p at offset off.
func resultsFor(t *testing.T, pool *pgxpool.Pool, p int, off int64) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM results WHERE partition_id = $1 AND msg_offset = $2`, p, off).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// ListParked shows each parked message as stored: its position, key,
// value, headers in order (a binary value as it was), the error, the
// attempts, the epoch and when it was parked, in position order; paging
// visits each once; another group sees none.
func TestListParkedShowsWhatWasParked(t *testing.T) {
	t.Parallel()
	b := newParkBed(t)
	headers := []kafka.Header{{Key: "id", Value: []byte("t-1")}, {Key: "bin", Value: []byte{0, 0xff}}}
	before := time.Now()
	var want []kafka.Message
	for _, p := range []int{1, 0, 1} {
		want = append(want, b.park(t, p, fmt.Sprint("acct-", p), headers, 3))
	}
	want[0], want[1] = want[1], want[0] // position order: 0@0, 1@0, 1@1
	got := listAll(t, b.consumer(t))
	if len(got) != len(want) {
		t.Fatalf("listed %d parked messages, want %d: %+v", len(got), len(want), got)
	}
	for i, p := range got {
		m := want[i]
		if p.ID != (partition.ParkedID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}) || p.Msg.Topic != m.Topic || p.Msg.Partition != m.Partition ||
			p.Msg.Offset != m.Offset || string(p.Msg.Key) != string(m.Key) || string(p.Msg.Value) != string(m.Value) {
			t.Errorf("parked %d: %s key %q value %q; want %s/%d@%d key %q value %q", i, p.ID, p.Msg.Key, p.Msg.Value, m.Topic, m.Partition, m.Offset, m.Key, m.Value)
		}
		if len(p.Msg.Headers) != 2 || p.Msg.Headers[0].Key != "id" || string(p.Msg.Headers[0].Value) != "t-1" || string(p.Msg.Headers[1].Value) != "\x00\xff" {
			t.Errorf("parked %d: headers %q, want id and bin as sent", i, p.Msg.Headers)
		}
		if !strings.Contains(p.Error, errPoison.Error()) || p.Attempts != 3 || p.Epoch != 1 || p.ParkedAt.Before(before.Add(-time.Minute)) {
			t.Errorf("parked %d: error %q, attempts %d, epoch %d, parked at %v; want the handler's error, 3, 1, now", i, p.Error, p.Attempts, p.Epoch, p.ParkedAt)
		}
	}
	other := &parkBed{pool: b.pool, group: testenv.Name("g"), topic: b.topic}
	if page, err := other.consumer(t).ListParked(context.Background(), partition.ParkedID{}, 10); err != nil || len(page) != 0 {
		t.Fatalf("another group lists %d parked messages (%v), want 0", len(page), err)
	}
}

// A replay that fails again leaves the message parked, says why and
// counts the attempt; with the handler fixed it applies the message once,
// leaves the partition's epoch and stored offset alone, and a second
// replay finds nothing.
func TestReplayParkedAfterFix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newParkBed(t)
	m := b.park(t, 0, "acct-1", nil, 3)
	id := partition.ParkedID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
	stillBroken := errors.New("still not a number")
	broken := b.consumer(t)
	stillFails := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if err := record("replay")(ctx, tx, msgs); err != nil {
			return err
		}
		return stillBroken // after a write: it must roll back
	}
	if err := broken.ReplayParked(ctx, id, stillFails); !errors.Is(err, stillBroken) {
		t.Fatalf("failing replay: %v; want the handler's error", err)
	}
	got := listAll(t, broken)
	if len(got) != 1 || got[0].Attempts != 4 || !strings.Contains(got[0].Error, stillBroken.Error()) || resultsFor(t, b.pool, 0, 0) != 0 {
		t.Fatalf("after a failing replay: parked %+v; want still parked, 4 attempts, the new error, no effect", got)
	}

	fixed := b.consumer(t)
	if err := fixed.ReplayParked(ctx, id, record("replay")); err != nil {
		t.Fatalf("replay after the fix: %v", err)
	}
	if n := resultsFor(t, b.pool, 0, 0); n != 1 {
		t.Fatalf("offset 0 applied %d times after the replay, want 1", n)
	}
	if ids := parkedIDs(t, fixed); ids != "" {
		t.Fatalf("still parked after the replay: %s", ids)
	}
	if err := fixed.ReplayParked(ctx, id, record("replay")); !errors.Is(err, partition.ErrNotParked) {
		t.Fatalf("second replay: %v, want ErrNotParked", err)
	}
	if n := resultsFor(t, b.pool, 0, 0); n != 1 {
		t.Fatalf("offset 0 applied %d times, want 1", n)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil || r.epoch != 1 || r.next == nil || *r.next != 1 {
		t.Fatalf("partition row %+v (%v) after the replay, want epoch 1 and offset 1 as parked", r, err)
	}
}

// Two replays of one parked message at once apply it once: the second
// waits for the first's transaction and, if that commits, finds nothing
// (ErrNotParked); if the first fails, the second applies it.
func TestConcurrentReplaysApplyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		firstFail bool
	}{
		{"first commits", false},
		{"first fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := newParkBed(t)
			m := b.park(t, 0, "k", nil, 1)
			id := partition.ParkedID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			slow := b.consumer(t)
			held := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
				once.Do(func() { close(entered) })
				<-release
				if err := record("first")(ctx, tx, msgs); err != nil {
					return err
				}
				if tc.firstFail {
					return errors.New("downstream refused")
				}
				return nil
			}
			first := make(chan error, 1)
			go func() { first <- slow.ReplayParked(ctx, id, held) }()
			<-entered
			second := make(chan error, 1)
			go func() { second <- b.consumer(t).ReplayParked(ctx, id, record("second")) }()
			testenv.WaitLockWaiters(t, b.pool, 1) // the second waits on the first's lock
			close(release)
			err1, err2 := <-first, <-second

			if tc.firstFail {
				if err1 == nil || err2 != nil {
					t.Fatalf("first %v, second %v; want the first's handler error, the second applied", err1, err2)
				}
			} else if err1 != nil || !errors.Is(err2, partition.ErrNotParked) {
				t.Fatalf("first %v, second %v; want nil and ErrNotParked", err1, err2)
			}
			if n := resultsFor(t, b.pool, 0, 0); n != 1 {
				t.Fatalf("offset 0 applied %d times, want 1", n)
			}
			if ids := parkedIDs(t, slow); ids != "" {
				t.Fatalf("still parked: %s", ids)
			}
		})
	}
}

// A replay runs between the partition owner's batches: it waits for the
// batch transaction in flight (which holds the partition's row) to end.
func TestReplayWaitsForTheOwnersBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newParkBed(t)
	m := b.park(t, 0, "k", nil, 1)
	batch, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Rollback(ctx)
	// The owner's fence: the same row update a batch begins with.
	if _, err := batch.Exec(ctx, `UPDATE `+partition.DefaultTable+` SET next_offset = next_offset + 1 WHERE group_id = $1 AND topic = $2 AND partition_id = 0`, b.group, b.topic); err != nil {
		t.Fatal(err)
	}
	replayed := make(chan error, 1)
	go func() {
		replayed <- b.consumer(t).ReplayParked(ctx, partition.ParkedID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}, record("replay"))
	}()
	testenv.WaitLockWaiters(t, b.pool, 1)
	if n := resultsFor(t, b.pool, 0, 0); n != 0 {
		t.Fatalf("the replay applied beside the owner's batch")
	}
	if err := batch.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	if n := resultsFor(t, b.pool, 0, 0); n != 1 {
		t.Fatalf("offset 0 applied %d times, want 1", n)
	}
}

// PurgeParked deletes the one named, no other; PurgeParkedOlderThan
// deletes the group's rows parked before the retention, no newer one and
// no other group's.
func TestPurgeParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newParkBed(t)
	for range 4 {
		b.park(t, 0, "k", nil, 1)
	}
	other := &parkBed{pool: b.pool, group: testenv.Name("g"), topic: b.topic, next: map[int]*int64{}}
	other.park(t, 0, "k", nil, 1)
	c := b.consumer(t)

	id := partition.ParkedID{Topic: b.topic, Partition: 0, Offset: 1}
	if err := c.PurgeParked(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := c.PurgeParked(ctx, id); !errors.Is(err, partition.ErrNotParked) {
		t.Fatalf("purging it again: %v, want ErrNotParked", err)
	}
	if ids := parkedIDs(t, c); ids != "transfers/0@0 transfers/0@2 transfers/0@3" {
		t.Fatalf("parked after purging offset 1: %s", ids)
	}

	if _, err := b.pool.Exec(ctx, `UPDATE `+partition.DefaultTable+`_parked SET parked_at = now() - interval '8 days' WHERE "offset" IN (0, 2)`); err != nil {
		t.Fatal(err)
	}
	n, err := c.PurgeParkedOlderThan(ctx, 7*24*time.Hour, 1)
	if err != nil || n != 2 {
		t.Fatalf("purged %d parked over 7 days ago (%v), want 2: offsets 0 and 2", n, err)
	}
	if ids := parkedIDs(t, c); ids != "transfers/0@3" {
		t.Fatalf("parked after the retention purge: %s, want offset 3", ids)
	}
	if ids := parkedIDs(t, other.consumer(t)); ids != "transfers/0@0" {
		t.Fatalf("the other group's parked after our purges: %s, want its offset 0, as old as ours", ids)
	}
}

// noIO is a DB that fails the test if it is used.
type noIO struct{ t *testing.T }

func (d noIO) Begin(context.Context) (pgx.Tx, error) {
	d.t.Error("Begin called")
	return nil, errors.New("no I/O")
}

// Bad input to the parked calls is ErrInvalid, before any I/O.
func TestParkedBadInput(t *testing.T) {
	t.Parallel()
	c, err := partition.New(noIO{t}, []string{"kafka.invalid:9092"}, "g", []string{"t"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var nilCtx context.Context
	good := partition.ParkedID{Topic: "t", Partition: 0, Offset: 0}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"list: nil ctx", func() error { _, err := c.ListParked(nilCtx, partition.ParkedID{}, 1); return err }()},
		{"list: limit 0", func() error { _, err := c.ListParked(ctx, partition.ParkedID{}, 0); return err }()},
		{"list: after with a negative offset", func() error { _, err := c.ListParked(ctx, partition.ParkedID{Topic: "t", Offset: -1}, 1); return err }()},
		{"replay: nil ctx", c.ReplayParked(nilCtx, good, record("x"))},
		{"replay: empty topic", c.ReplayParked(ctx, partition.ParkedID{}, record("x"))},
		{"replay: negative partition", c.ReplayParked(ctx, partition.ParkedID{Topic: "t", Partition: -1}, record("x"))},
		{"replay: negative offset", c.ReplayParked(ctx, partition.ParkedID{Topic: "t", Offset: -2}, record("x"))},
		{"replay: topic not UTF-8", c.ReplayParked(ctx, partition.ParkedID{Topic: "\xff"}, record("x"))},
		{"replay: nil handler", c.ReplayParked(ctx, good, nil)},
		{"purge: nil ctx", c.PurgeParked(nilCtx, good)},
		{"purge: empty topic", c.PurgeParked(ctx, partition.ParkedID{Offset: 3})},
		{"purge older: nil ctx", func() error { _, err := c.PurgeParkedOlderThan(nilCtx, time.Hour, 1000); return err }()},
		{"purge older: zero retention", func() error { _, err := c.PurgeParkedOlderThan(ctx, 0, 1000); return err }()},
		{"purge older: zero batch", func() error { _, err := c.PurgeParkedOlderThan(ctx, time.Hour, 0); return err }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, partition.ErrInvalid) {
				t.Errorf("%v, want ErrInvalid", tc.err)
			}
		})
	}
}

// End to end on Kafka: a poison message parked by Run is listed with the
// handler's error and the epoch of the worker that parked it; replayed
// with the handler fixed, it is applied once, beside every other offset
// applied once, and the partition's stored offset stays at its end.
func TestRunParksThenReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const per, poisonOff = 6, 3
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, per)
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs {
			if m.Offset == poisonOff {
				return errPoison
			}
		}
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(2))
	var parked parkLog
	cfg.with(partition.WithObserver(observe.Func(parked.observe)))
	m := startMember(t, b.pool, cfg)
	testenv.Until(t, "the stored offset at the partition's end", func() (bool, error) {
		r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil // not claimed yet
		}
		return err == nil && r.next != nil && *r.next == per, err
	})
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	c, err := newConsumer(b.pool, b.config("operator", nil))
	if err != nil {
		t.Fatal(err)
	}
	got := listAll(t, c)
	if len(got) != 1 || got[0].ID.Offset != poisonOff || string(got[0].Msg.Value) != fmt.Sprintf("0-%d", poisonOff) ||
		got[0].Attempts != 2 || !strings.Contains(got[0].Error, errPoison.Error()) || got[0].Epoch < 1 {
		t.Fatalf("listed %+v; want the poison at offset %d, 2 attempts, the handler's error, the worker's epoch", got, poisonOff)
	}
	if err := c.ReplayParked(ctx, got[0].ID, record("operator")); err != nil {
		t.Fatal(err)
	}
	tl, err := count(ctx, b.pool, 1, per)
	if err != nil {
		t.Fatal(err)
	}
	// In commit order the replayed offset comes last: one "out of order" row.
	if tl.rows != per || tl.dups != 0 || tl.missing != 0 || tl.badValue != 0 || tl.reordered != 1 {
		t.Fatalf("results %v; want %d rows, each offset once, the replayed one last", tl, per)
	}
	r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
	if err != nil || r.next == nil || *r.next != per {
		t.Fatalf("stored offset %v (%v) after the replay, want %d", r.next, err, per)
	}
	if msgs, _ := parked.snapshot(); len(msgs) != 1 {
		t.Fatalf("EventParked reported %d times, want 1", len(msgs))
	}
}
