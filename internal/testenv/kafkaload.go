package testenv

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// Load is a producer that keeps writing numbered messages to every
// partition of a topic, for fault tests that count what the consumers
// applied against what Kafka acknowledged. It writes as a careful
// producer does: acks from all in-sync replicas (acks=all), kafka-go's
// retries inside each write, and a write that still fails is sent again
// (the same messages) until Kafka acknowledges it, so a message whose
// first write landed but was not acknowledged is in the log twice.
//
// Message i of partition p has the id "p-i" (i from 0, in write order),
// as its key, its value and its "id" header.
type Load struct {
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	acked  []string
	failed int   // writes that failed and were sent again
	err    error // why the producer gave up

	count atomic.Int64 // acknowledged messages
}

// StartLoad writes, every interval, one message to each of the topic's
// partitions (numbered 0 to partitions-1) as one write, waiting for its
// acknowledgement before the next, until Stop. The producer owns its
// goroutine; Stop waits for it, and so does the end of the test.
func (k *KafkaCluster) StartLoad(topic string, partitions int, interval time.Duration) *Load {
	l := &Load{stop: make(chan struct{}), done: make(chan struct{})}
	// A short metadata TTL: kafka-go's Writer learns a partition's new
	// leader only from its cached metadata (Java's producer refreshes on
	// NOT_LEADER at once).
	tr := &kafka.Transport{MetadataTTL: time.Second}
	w := &kafka.Writer{
		Addr: kafka.TCP(k.brokers...), Topic: topic, Transport: tr,
		RequiredAcks: kafka.RequireAll, MaxAttempts: 10,
		WriteBackoffMin: 50 * time.Millisecond, WriteBackoffMax: 500 * time.Millisecond,
		BatchSize: partitions, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int {
			p, _ := strconv.Atoi(strings.SplitN(string(m.Key), "-", 2)[0])
			return p
		}),
	}
	go func() {
		defer close(l.done)
		defer tr.CloseIdleConnections()
		defer w.Close()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			msgs := make([]kafka.Message, partitions)
			for p := range msgs {
				id := []byte(fmt.Sprintf("%d-%d", p, i))
				msgs[p] = kafka.Message{Key: id, Value: id, Headers: []kafka.Header{{Key: "id", Value: id}}}
			}
			if err := l.write(w, msgs); err != nil {
				l.mu.Lock()
				l.err = err
				l.mu.Unlock()
				return
			}
			select {
			case <-l.stop:
				return
			case <-tick.C:
			}
		}
	}()
	k.t.Cleanup(func() { _, _, _ = l.Stop() })
	return l
}

// write sends msgs until each is acknowledged: after a failure, the
// messages whose write failed are sent again. Once Stop was called, it
// gives up after a minute (scaled) of failures.
func (l *Load) write(w *kafka.Writer, msgs []kafka.Message) error {
	var giveUp <-chan time.Time
	for attempt := 1; len(msgs) > 0; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), Scale(30*time.Second))
		err := w.WriteMessages(ctx, msgs...)
		cancel()
		var werrs kafka.WriteErrors
		var retry []kafka.Message
		switch {
		case err == nil:
		case errors.As(err, &werrs) && len(werrs) == len(msgs):
			for i, e := range werrs {
				if e != nil {
					retry = append(retry, msgs[i])
				}
			}
		default:
			retry = msgs
		}
		l.mu.Lock()
		for _, m := range msgs {
			if !contains(retry, m) {
				l.acked = append(l.acked, string(m.Value))
				l.count.Add(1)
			}
		}
		if len(retry) > 0 {
			l.failed++
		}
		l.mu.Unlock()
		msgs = retry
		if len(msgs) == 0 {
			return nil
		}
		if giveUp == nil {
			select {
			case <-l.stop:
				giveUp = time.After(Scale(time.Minute))
			default:
			}
		}
		select {
		case <-giveUp:
			return fmt.Errorf("testenv: load: %d messages not acknowledged a minute after Stop (%d attempts): %w", len(msgs), attempt, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func contains(msgs []kafka.Message, m kafka.Message) bool {
	for _, x := range msgs {
		if string(x.Value) == string(m.Value) {
			return true
		}
	}
	return false
}

// Acked returns how many messages Kafka has acknowledged so far.
func (l *Load) Acked() int { return int(l.count.Load()) }

// Stop stops the producer once its write in flight is acknowledged and
// returns the ids of every message Kafka acknowledged, and how many
// writes failed and were sent again (each may have landed anyway: its
// messages may be in the log twice). err is set when the producer gave up
// on a write. Stop may be called more than once.
func (l *Load) Stop() (acked []string, resent int, err error) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.acked...), l.failed, l.err
}

// ReadLog returns the messages of a partition of topic from its first
// offset up to its high watermark now: what Kafka holds, duplicates
// included, in offset order. It reads under the fault lock (no other
// test kills a node meanwhile) and starts over after a failure.
func (k *KafkaCluster) ReadLog(topic string, partition int) []kafka.Message {
	k.t.Helper()
	if k.lock == nil {
		k.acquire()
		defer k.release()
	}
	var out []kafka.Message
	Until(k.t, fmt.Sprintf("%s/%d read", topic, partition), func() (bool, error) {
		var err error
		out, err = readLog(k.brokers, topic, partition)
		if err != nil {
			k.t.Logf("testenv: reading %s/%d: %v; reading again", topic, partition, err)
		}
		return err == nil, nil
	})
	return out
}

func readLog(brokers []string, topic string, partition int) ([]kafka.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
		topic: {kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition)}}})
	if err != nil {
		return nil, err
	}
	var first, end int64 = -1, -1
	for _, po := range res.Topics[topic] {
		if po.Partition == partition {
			if po.Error != nil {
				return nil, po.Error
			}
			first, end = po.FirstOffset, po.LastOffset
		}
	}
	if first < 0 || end < first {
		return nil, fmt.Errorf("list offsets: %+v", res.Topics[topic])
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(first); err != nil {
		return nil, err
	}
	var out []kafka.Message
	for next := first; next < end; {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("at offset %d of %d: %w", next, end, err)
		}
		out = append(out, m)
		next = m.Offset + 1
	}
	return out, nil
}
