package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// A topic that grows from one partition to three while a member consumes
// it: the member's partition watch notices, the group rebalances once, and
// the new partitions are claimed and applied from their first offset;
// every message of every partition is applied exactly once.
func TestPartitionsAddedAreConsumed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const per = 5
	b := newBed(t, 1)
	cfg := b.config("m", nil)
	cfg.with(partition.WithPartitionWatchInterval(200 * time.Millisecond))
	m := startMember(t, b.pool, cfg)
	produce(t, b.brokers, b.topic, 1, 0, per)
	testenv.Until(t, "partition 0 applied", func() (bool, error) {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n)
		return n == per, err
	})

	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: testenv.Scale(30 * time.Second)}
	res, err := cl.CreatePartitions(ctx, &kafka.CreatePartitionsRequest{Topics: []kafka.TopicPartitionsConfig{{Name: b.topic, Count: 3}}})
	if err == nil {
		err = res.Errors[b.topic]
	}
	if err != nil {
		t.Fatalf("create partitions: %v", err)
	}
	testenv.Until(t, "the new partitions have leaders", func() (bool, error) {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.topic}})
		if err != nil || len(md.Topics) != 1 {
			return false, nil
		}
		led := 0
		for _, p := range md.Topics[0].Partitions {
			if p.Error == nil && p.Leader.ID >= 0 && p.Leader.Host != "" {
				led++
			}
		}
		return led == 3, nil
	})
	produce(t, b.brokers, b.topic, 3, per, per)
	testenv.Until(t, "every partition applied", func() (bool, error) {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results`).Scan(&n)
		return n >= 4*per, err
	})
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(ctx, `SELECT partition_id, count(*), count(DISTINCT msg_offset) FROM results GROUP BY partition_id ORDER BY partition_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int][2]int{}
	for rows.Next() {
		var p, n, distinct int
		if err := rows.Scan(&p, &n, &distinct); err != nil {
			t.Fatal(err)
		}
		got[p] = [2]int{n, distinct}
	}
	want := map[int][2]int{0: {2 * per, 2 * per}, 1: {per, per}, 2: {per, per}}
	t.Logf("rows and distinct offsets per partition: %v", got)
	for p, w := range want {
		if got[p] != w {
			t.Fatalf("partition %d: %d rows, %d distinct offsets; want %v (all: %v)", p, got[p][0], got[p][1], w, got)
		}
	}
}
