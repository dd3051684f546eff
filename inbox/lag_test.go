package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// Stats' lag per partition: of n messages produced, after k handled by
// Process the lag is n-k (the high-water mark from the fetched messages);
// Run (through a Reader with a GroupID, whose own Lag is unknown) brings
// it to 0.
func TestStatsLag(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	brokers, topic := testenv.Topic(t, 1)
	const n, k = 10, 4
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("m-", i)
	}
	produce(t, brokers, topic, ids, func(id string) string { return id })
	in, err := inbox.New(pool, testenv.Name("c"))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := in.Stats().Partitions; len(got) != 0 {
		t.Fatalf("Partitions before any message: %+v, want none", got)
	}
	h := func(context.Context, pgx.Tx, kafka.Message) error { return nil }

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	msgs := make([]kafka.Message, k)
	for i := range msgs {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(30*time.Second))
		msgs[i], err = r.FetchMessage(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Process(context.Background(), msgs, h); err != nil {
		t.Fatal(err)
	}
	want := inbox.PartitionStats{Topic: topic, Partition: 0, NextOffset: k, HighWaterMark: n, Lag: n - k}
	if got := in.Stats().Partitions; len(got) != 1 || got[0] != want {
		t.Fatalf("Partitions after %d of %d: %+v, want [%+v]", k, n, got, want)
	}

	g := groupReader(brokers, topic, testenv.Name("g"))
	defer g.Close()
	runUntil(t, in, g, h, func() bool { return in.Stats().Processed == n })
	want = inbox.PartitionStats{Topic: topic, Partition: 0, NextOffset: n, HighWaterMark: n, Lag: 0}
	st := in.Stats()
	if len(st.Partitions) != 1 || st.Partitions[0] != want || st.Duplicates != k {
		t.Errorf("after Run: Partitions %+v, Duplicates %d; want [%+v], %d", st.Partitions, st.Duplicates, want, k)
	}
}

// A message without a high-water mark (built by hand) has an unknown lag.
func TestStatsLagUnknown(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(testenv.Postgres(t), "c")
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	msg := kafka.Message{Topic: "t", Partition: 3, Offset: 7, Headers: []kafka.Header{{Key: "id", Value: []byte("x")}}}
	if _, err := in.Process(context.Background(), []kafka.Message{msg}, func(context.Context, pgx.Tx, kafka.Message) error { return nil }); err != nil {
		t.Fatal(err)
	}
	want := inbox.PartitionStats{Topic: "t", Partition: 3, NextOffset: 8, Lag: -1}
	if got := in.Stats().Partitions; len(got) != 1 || got[0] != want {
		t.Errorf("Partitions %+v, want [%+v]", got, want)
	}
}
