package nolockotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/partition"
)

// produceWithIDs writes n messages with an id header; the third is poison.
func produceWithIDs(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		value := fmt.Sprint("ok-", i)
		if i == 2 {
			value = "poison"
		}
		msgs[i] = kafka.Message{Value: []byte(value), Headers: []kafka.Header{{Key: "id", Value: []byte(fmt.Sprint("m-", i))}}}
	}
	produceMsgs(t, brokers, topic, msgs)
}

// record is a handler of both consumers: it records the message's id for
// consumer, and fails a poison message.
func record(ctx context.Context, tx pgx.Tx, consumer string, m kafka.Message) error {
	if string(m.Value) == "poison" {
		return errors.New("poison")
	}
	_, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1, $2)`, consumer, fmt.Sprint(m.Partition, "@", m.Offset))
	return err
}

// waitResults waits until consumer recorded want messages.
func waitResults(t *testing.T, pool *pgxpool.Pool, consumer string, want int) {
	t.Helper()
	testenv.Until(t, fmt.Sprintf("%d results of %s", want, consumer), func() (bool, error) {
		var got int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM results WHERE consumer = $1`, consumer).Scan(&got)
		return got >= want, err
	})
}

// runInbox runs an inbox over topic (two attempts, then a message is
// parked), whose lag the Adapter observes, until it recorded want
// messages and parked the poison one.
func runInbox(t *testing.T, a *nolockotel.Adapter, pool *pgxpool.Pool, brokers []string, topic string, want int) {
	t.Helper()
	ctx := context.Background()
	in, err := inbox.New(pool, "billing", inbox.WithObserver(a), inbox.WithAttempts(2),
		inbox.WithBackoff(time.Millisecond, 10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ObserveLag(nolockotel.InboxLag("billing", in)); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: testenv.Name("billing"), Topic: topic,
		MaxWait: 200 * time.Millisecond, StartOffset: kafka.FirstOffset})
	defer r.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- in.Run(runCtx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error { return record(ctx, tx, "inbox", m) })
	}()
	waitResults(t, pool, "inbox", want)
	testenv.Until(t, "the poison message parked", func() (bool, error) { return in.Stats().Parked == 1, nil })
	stop()
	if err := <-done; err != nil {
		t.Fatalf("inbox Run: %v", err)
	}
}

// runConsumer runs a partition Consumer over topic, whose lag the Adapter
// observes, until it recorded want-1 messages and parked the poison one;
// it keeps running until the returned stop.
func runConsumer(t *testing.T, a *nolockotel.Adapter, pool *pgxpool.Pool, brokers []string, topic string, want int) (stop func()) {
	t.Helper()
	group := testenv.Name("g")
	c, err := partition.New(pool, brokers, group, []string{topic},
		partition.WithAttempts(1), partition.WithObserver(a), partition.WithHeartbeatInterval(200*time.Millisecond),
		partition.WithSessionTimeout(6*time.Second), partition.WithRebalanceTimeout(3*time.Second),
		partition.WithJoinGroupBackoff(200*time.Millisecond), partition.WithBatchTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ObserveLag(nolockotel.PartitionLag(group, c)); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(runCtx, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			for _, m := range msgs {
				if err := record(ctx, tx, "partition", m); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("partition Run: %v", err)
		}
	})
	waitResults(t, pool, "partition", want-1)
	return stop
}
