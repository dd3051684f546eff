package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// kafkaCommitted reads the group's committed Kafka offset of partition 0.
func kafkaCommitted(t *testing.T, b *bed) int64 {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := client.OffsetFetch(context.Background(), &kafka.OffsetFetchRequest{GroupID: b.group, Topics: map[string][]int{b.topic: {0}}})
	if err != nil || res.Error != nil {
		t.Fatalf("offset fetch: %v %v", err, res.Error)
	}
	for _, p := range res.Topics[b.topic] {
		if p.Partition == 0 {
			return p.CommittedOffset
		}
	}
	t.Fatal("offset fetch: no partition 0")
	return 0
}

// KafkaCommitInterval commits the trailing offset of a burst: once the
// partition stays idle until the interval is up, and when the worker
// lets go. Before, only a batch applied after the interval was up
// committed, so the last batches of a burst never reached Kafka and lag
// tools showed a lag that was not there.
func TestKafkaCommitTrailingEdge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		interval time.Duration
		stop     bool // read Kafka's offset after stopping the member
	}{
		{"idle", 3 * time.Second, false},
		{"release", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := newBed(t, 1)
			cfg := b.config("m", nil)
			cfg.with(partition.WithKafkaCommitInterval(tc.interval))
			m := startMember(t, b.pool, cfg)
			produce(t, b.brokers, b.topic, 1, 0, 10)
			if err := waitRows(ctx, b.pool, 10); err != nil {
				t.Fatal(err)
			}
			produce(t, b.brokers, b.topic, 1, 10, 10)
			if err := waitRows(ctx, b.pool, 20); err != nil {
				t.Fatal(err)
			}
			if tc.stop {
				if err := m.stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			deadline := time.Now().Add(tc.interval%time.Hour + testenv.Scale(5*time.Second))
			for {
				got := kafkaCommitted(t, b)
				if got == 20 {
					return
				}
				if tc.stop || time.Now().After(deadline) {
					t.Fatalf("Kafka's committed offset %d, want 20", got)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
