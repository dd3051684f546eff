package partition_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// Stats reports each owned partition: while the first batches are held,
// the high-water mark of what was produced and a lag of all of it; once
// they are applied, lag 0 and counts equal to what was produced; again
// after more is produced; and nothing once Run returned.
func TestStatsLagFallsToZero(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts, first, more = 2, 25, 15
	b := newBed(t, parts)
	produce(t, b.brokers, b.topic, parts, 0, first)
	hold := make(chan struct{})
	var release sync.Once
	defer release.Do(func() { close(hold) })
	cfg := b.config("m", nil)
	c, err := newConsumer(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	partition.SetBeforeFence(c, func(partition.Claim, []kafka.Message) { <-hold })
	m := runMember(t, c, cfg.handler)

	waitStats(t, m.c, "both partitions fetched, nothing applied", func(s partition.PartitionStats) bool {
		return s.HighWaterMark == first && s.Lag == first && s.NextOffset == 0 && s.Messages == 0 && s.LastApplied == -1
	})
	release.Do(func() { close(hold) })
	waitStats(t, m.c, fmt.Sprintf("lag 0 after %d messages each", first), func(s partition.PartitionStats) bool {
		return s.Lag == 0 && s.Messages == first
	})
	produce(t, b.brokers, b.topic, parts, first, more)
	waitStats(t, m.c, fmt.Sprintf("lag 0 after %d messages each", first+more), func(s partition.PartitionStats) bool {
		return s.Lag == 0 && s.Messages == first+more
	})
	for _, s := range m.c.Stats() {
		const n = first + more
		if s.Topic != b.topic || s.Epoch < 1 || s.Generation < 1 || s.HighWaterMark != n || s.NextOffset != n ||
			s.LastApplied != n-1 || s.Parked != 0 || s.Skipped != 0 || s.Batches < n/testMaxBatch || s.Batches > n {
			t.Errorf("stats: %+v", s)
		}
		if s.FetchErrors != 0 {
			t.Logf("partition %d: %d fetch errors (retried)", s.Partition, s.FetchErrors)
		}
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if s := m.c.Stats(); s != nil {
		t.Errorf("Stats after Run returned: %+v", s)
	}
	tl, err := count(ctx, b.pool, parts, first+more)
	if err != nil || !tl.exact() {
		t.Fatalf("results: %v (%v)", tl, err)
	}
}

// waitStats waits until c reports both partitions of the test's topic and
// cond holds for each.
func waitStats(t *testing.T, c *partition.Consumer, what string, cond func(partition.PartitionStats) bool) {
	t.Helper()
	var last []partition.PartitionStats
	err := testenv.Poll(what, func() (bool, error) {
		last = c.Stats()
		if len(last) != 2 || last[0].Partition != 0 || last[1].Partition != 1 {
			return false, nil
		}
		return cond(last[0]) && cond(last[1]), nil
	})
	if err != nil {
		t.Fatalf("%v; the last stats: %+v", err, last)
	}
	t.Logf("%s: %+v", what, last)
}
