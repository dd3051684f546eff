package partition_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// Fault: on the three-node Kafka cluster, the leader of a partition being
// consumed is SIGKILLed under load, stays down a few seconds while its
// member goes on with the partition's new leader, and is started again.
// Several rounds, a different partition each; every other round kills the
// node that also coordinates the consumer group, if it leads a partition.
// A producer writes throughout (acks=all, resending what failed, so a
// message may be in the log twice), and two members apply each batch in
// its fenced transaction. Then, for each partition, the results hold
// every offset of the log exactly once, in offset order (commit order),
// each with the message Kafka holds at that offset, and the stored offset
// is the log's end; every message Kafka acknowledged is applied; nothing
// is parked, no worker stops with an error, and neither Run returns
// before it is stopped (then with nil).
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka3(t)
	pool, schema := testenv.PostgresSchema(t, 16)
	const partitions = 4
	rounds := testenv.Trials(2, 10)
	b := &bed{brokers: k.Brokers(), topic: k.CreateTopic(partitions), group: testenv.Name("g"), schema: schema, pool: pool}
	ctx := context.Background()
	setup, err := newConsumer(pool, b.config("setup", nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := setup.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE results (
		seq bigserial PRIMARY KEY, topic text NOT NULL, partition_id int NOT NULL,
		msg_offset bigint NOT NULL, value text NOT NULL, epoch bigint NOT NULL, member text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// Two members in this process: a member that stopped would show as a
	// Run that returned.
	var claims, failed, parked atomic.Int64
	warnings := &logWriter{t: t} // what the members log: the Kafka errors they ride out
	const members = 2
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, members)
	returned := 0
	for i := range members {
		name := fmt.Sprint("m", i)
		cfg := b.config(name, nil)
		cfg.with(partition.WithLogger(slog.New(slog.NewTextHandler(warnings, &slog.HandlerOptions{Level: slog.LevelWarn})).With("member", name)))
		cfg.with(partition.WithOnClaim(func(partition.Claim) { claims.Add(1) }))
		cfg.with(partition.WithOnRelease(func(cl partition.Claim, err error) {
			if err != nil {
				failed.Add(1)
				t.Logf("member %s: %v released with %v", name, cl, err)
			}
		}))
		cfg.with(partition.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
			if e.Name == partition.EventParked {
				parked.Add(1)
			}
		})))
		c, err := newConsumer(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- c.Run(runCtx, cfg.handler) }()
	}
	t.Cleanup(func() { // the Runs end before the test does, also when it fails
		cancel()
		for ; returned < members; returned++ {
			<-done
		}
	})
	running := func() {
		t.Helper()
		select {
		case err := <-done:
			returned++
			t.Fatalf("a member's Run returned while the test ran: %v", err)
		default:
		}
	}
	applied := func(p int) int { // rows of partition p (p < 0: all)
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE $1::int < 0 OR partition_id = $1::int`, p).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	load, coordinatorKills := k.LeaderKills(t, b.topic, b.group, partitions, rounds, applied, running,
		func() string { return fmt.Sprintf("%d warnings logged", warnings.n.Load()) })
	acked, resent, err := load.Stop()
	if err != nil {
		t.Fatal(err)
	}

	// Compare, partition by partition, what was applied with the log.
	logs := make([][]string, partitions) // value at each offset
	logRows, inLog := 0, map[string]bool{}
	for p := range partitions {
		for _, m := range k.ReadLog(b.topic, p) {
			if m.Offset != int64(len(logs[p])) {
				t.Fatalf("partition %d: the log has offset %d after %d records: want no gaps (no compaction, no transactions)", p, m.Offset, len(logs[p]))
			}
			logs[p] = append(logs[p], string(m.Value))
			inLog[string(m.Value)] = true
		}
		logRows += len(logs[p])
	}
	testenv.Until(t, fmt.Sprintf("all %d offsets applied", logRows), func() (bool, error) {
		running()
		return applied(-1) >= logRows, nil
	})
	cancel()
	for ; returned < members; returned++ {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}

	rows, err := pool.Query(ctx, `SELECT partition_id, msg_offset, value, epoch FROM results ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	next := make([]int64, partitions) // the offset each partition should apply next
	epoch := make([]int64, partitions)
	appliedIDs := map[string]bool{}
	doubled, reordered, wrong, epochDown := 0, 0, 0, 0
	for rows.Next() {
		var p int
		var off, ep int64
		var val string
		if err := rows.Scan(&p, &off, &val, &ep); err != nil {
			t.Fatal(err)
		}
		switch {
		case off < next[p]:
			doubled++
		case off > next[p]:
			reordered++ // a gap: an offset skipped, or applied out of order
		}
		if off >= int64(len(logs[p])) || logs[p][off] != val {
			wrong++
		}
		if ep < epoch[p] {
			epochDown++
		}
		next[p], epoch[p] = max(next[p], off+1), max(epoch[p], ep)
		appliedIDs[val] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost, ackedLost := 0, 0
	for p := range partitions {
		lost += len(logs[p]) - int(next[p])
		r, err := readRow(ctx, pool, b.group, b.topic, p)
		if err != nil || r.next == nil || *r.next != int64(len(logs[p])) {
			t.Errorf("partition %d: stored row %+v (%v), want next offset %d", p, r, err, len(logs[p]))
		}
	}
	for _, id := range acked {
		if !appliedIDs[id] {
			ackedLost++
		}
	}
	testenv.Figures(t, "partition Kafka broker restart", "%d kills (%d of the group coordinator too), %d offsets (%d messages acknowledged, %d written twice by %d resent writes), %d lost, %d doubled, %d out of order; %d claims",
		rounds, coordinatorKills, logRows, len(acked), logRows-len(inLog), resent, lost, doubled, reordered, claims.Load())
	if lost != 0 || doubled != 0 || reordered != 0 || wrong != 0 || epochDown != 0 || ackedLost != 0 {
		t.Errorf("%d offsets in the log: %d lost, %d applied twice, %d out of order, %d with another message's value, %d epochs going down, %d acknowledged messages not applied",
			logRows, lost, doubled, reordered, wrong, epochDown, ackedLost)
	}
	if len(acked) != len(inLog) {
		t.Errorf("%d messages acknowledged, %d distinct in the log: want the same (the producer resends until acknowledged)", len(acked), len(inLog))
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d workers released with an error, want 0", n)
	}
	if n := parked.Load(); n != 0 {
		t.Errorf("%d messages parked, want 0: a broker restart is not the message's fault", n)
	}
}

// logWriter writes each log record (slog's text handlers write one per
// call) to the test's log, and counts them.
type logWriter struct {
	t *testing.T
	n atomic.Int64
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.n.Add(1)
	w.t.Logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}
