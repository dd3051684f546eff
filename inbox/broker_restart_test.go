package inbox_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: on the three-node Kafka cluster, the leader of a partition being
// consumed is SIGKILLed under load, stays down a few seconds while the
// consumers go on with the partition's new leader, and is started again.
// Several rounds, a different partition each; every other round kills the
// node that also coordinates the consumer group, if it leads a partition.
// A producer writes throughout (acks=all, resending what failed, so a
// message may be in the log twice), and two consumer-group members apply
// through the inbox. Then every message in the log is applied exactly
// once (none lost, none doubled, the producer's duplicates included),
// every message Kafka acknowledged is among them, nothing is parked, and
// neither Run returns before it is stopped (then with nil).
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka3(t)
	pool, _ := testenv.PostgresSchema(t, 12)
	warnings := &logWriter{t: t} // what Run logs: the Kafka errors it rides out
	in := newInbox(t, pool, inbox.WithLogger(slog.New(slog.NewTextHandler(warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))),
		inbox.WithMaxBatch(10), inbox.WithBatchWait(20*time.Millisecond), inbox.WithBackoff(20*time.Millisecond, time.Second))
	const partitions = 4
	rounds := testenv.Trials(2, 10)
	topic := k.CreateTopic(partitions)
	brokers, group := k.Brokers(), testenv.Name("g")

	ctx, cancel := context.WithCancel(context.Background())
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, string(m.Headers[0].Value), string(m.Value))
		return err
	}
	// Two members, each its own Reader, in this process: a member that
	// stopped would show as a Run that returned.
	const members = 2
	done := make(chan error, members)
	returned := 0
	for range members {
		r := groupReader(brokers, topic, group)
		go func() {
			defer r.Close()
			done <- in.Run(ctx, r, h)
		}()
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
			t.Fatalf("a consumer's Run returned while the test ran: %v", err)
		default:
		}
	}
	// applied counts the distinct ids applied of partition p (p < 0: all).
	applied := func(p int) int {
		t.Helper()
		prefix := ""
		if p >= 0 {
			prefix = fmt.Sprintf("%d-", p)
		}
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT id) FROM effects WHERE starts_with(id, $1)`, prefix).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	load, coordinatorKills := k.LeaderKills(t, topic, group, partitions, rounds, applied, running,
		func() string { return fmt.Sprintf("%d warnings logged", warnings.n.Load()) })
	acked, resent, err := load.Stop()
	if err != nil {
		t.Fatal(err)
	}
	// The log: what Kafka holds, the producer's duplicates included.
	inLog, logRows := map[string]bool{}, 0
	for p := range partitions {
		for _, m := range k.ReadLog(topic, p) {
			inLog[string(m.Value)] = true
			logRows++
		}
	}
	testenv.Until(t, fmt.Sprintf("all %d messages applied", len(inLog)), func() (bool, error) {
		running()
		return applied(-1) >= len(inLog), nil
	})
	cancel()
	for ; returned < members; returned++ {
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}

	got := effects(t, pool)
	lost, doubled, unknown, ackedLost := 0, 0, 0, 0
	for id := range inLog {
		switch n := got[id]; {
		case n == 0:
			lost++
		case n > 1:
			doubled += n - 1
		}
	}
	for id := range got {
		if !inLog[id] {
			unknown++
		}
	}
	for _, id := range acked {
		if !inLog[id] || got[id] == 0 {
			ackedLost++
		}
	}
	testenv.Figures(t, "inbox Kafka broker restart", "%d kills (%d of the group coordinator too), %d messages (%d acknowledged, %d log records: %d written twice by %d resent writes), %d lost, %d doubled",
		rounds, coordinatorKills, len(inLog), len(acked), logRows, logRows-len(inLog), resent, lost, doubled)
	if lost != 0 || doubled != 0 || unknown != 0 || ackedLost != 0 {
		t.Errorf("%d messages in the log: %d lost, %d applied more than once, %d effects of no message, %d acknowledged messages lost",
			len(inLog), lost, doubled, unknown, ackedLost)
	}
	if len(acked) != len(inLog) {
		t.Errorf("%d messages acknowledged, %d distinct in the log: want the same (the producer resends until acknowledged)", len(acked), len(inLog))
	}
	if k := count(t, pool, `SELECT (SELECT count(*) FROM nolock_inbox_parked) + (SELECT count(*) FROM nolock_inbox_attempts)`); k != 0 {
		t.Errorf("%d messages parked or with failed attempts counted, want 0: a broker restart is not the message's fault", k)
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
