package services

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// kafkaClient returns a client with its own transport, and a func that
// closes the transport's connections: kafka-go's default transport keeps
// them (and their goroutines) for the life of the process.
func kafkaClient(brokers []string) (*kafka.Client, func()) {
	tr := &kafka.Transport{}
	return &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: tr}, tr.CloseIdleConnections
}

// CreateTopic creates topic with the given number of partitions and waits
// until every partition has a leader.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	client, done := kafkaClient(brokers)
	defer done()
	err := retryBusy(ctx, kafka.TopicAlreadyExists, func() error {
		res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
			Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
		}}})
		if err == nil {
			err = res.Errors[topic]
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Host != ""
			}
			if ready {
				ready, err = leadersServe(ctx, client, topic, partitions)
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s: partitions without a leader: %w", topic, errors.Join(ctx.Err(), err))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// leadersServe reports whether every partition's leader answers a
// ListOffsets for it: the metadata can name a leader before that broker
// serves the partition, and a produce then fails with NOT_LEADER.
func leadersServe(ctx context.Context, client *kafka.Client, topic string, partitions int) (bool, error) {
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range reqs {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	res, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return false, err
	}
	served := 0
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return false, po.Error
		}
		served++
	}
	return served == partitions, nil
}

// DeleteTopic deletes topic.
func DeleteTopic(ctx context.Context, brokers []string, topic string) error {
	client, done := kafkaClient(brokers)
	defer done()
	err := retryBusy(ctx, kafka.UnknownTopicOrPartition, func() error {
		res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = res.Errors[topic]
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("delete topic %s: %w", topic, err)
	}
	return nil
}

// retryBusy runs op until it succeeds, fails for good, or ctx ends. A
// broker too busy to keep its place in the cluster (a heavily loaded
// machine) answers one of the errors below for a while: op is tried
// again, and a retry that answers applied (the attempt before it took
// effect) succeeds.
func retryBusy(ctx context.Context, applied kafka.Error, op func() error) error {
	for retry := false; ; retry = true {
		err := op()
		if retry && errors.Is(err, applied) {
			return nil
		}
		var kerr kafka.Error
		if !errors.As(err, &kerr) {
			return err
		}
		switch kerr {
		case kafka.BrokerNotAvailable, kafka.LeaderNotAvailable, kafka.NotController, kafka.RequestTimedOut:
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// KafkaRoundTrip produces n messages to topic (one partition) and reads
// them back through a consumer-group member, committing the offset. It
// returns how many distinct messages came back.
func KafkaRoundTrip(ctx context.Context, brokers []string, topic, group string, n int) (int, error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: n, Transport: tr}
	defer w.Close()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i].Value = fmt.Appendf(nil, "m%d", i)
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return 0, err
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: group, Brokers: brokers, Topics: []string{topic}, StartOffset: kafka.FirstOffset,
		HeartbeatInterval: 200 * time.Millisecond, JoinGroupBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		return 0, err
	}
	defer cg.Close()
	gen, err := cg.Next(ctx)
	if err != nil {
		return 0, err
	}
	pa := gen.Assignments[topic][0]
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: pa.ID, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(pa.Offset); err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	for len(seen) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			return len(seen), err
		}
		seen[string(m.Value)] = true
	}
	return len(seen), gen.CommitOffsets(map[string]map[int]int64{topic: {pa.ID: int64(n)}})
}
