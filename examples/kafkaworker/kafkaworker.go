// Package kafkaworker applies payment messages from Kafka to PostgreSQL
// through the transactional inbox, the story `nolock demo` tells (-run
// 'kafka worker'; examples/workerservice is the service to copy): the
// message's id and its effect commit in one transaction, so redeliveries
// and producer duplicates apply once.
//
// It produces the payments itself, keyed by account over several
// partitions (a tenth of them twice, as a retrying producer would), runs
// a worker that crashes halfway without committing any Kafka offset, and
// starts a new worker, which gets every message again: the inbox skips
// what was applied, and every payment is applied exactly once.
package kafkaworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/observe"
)

// Config is where and how the story runs.
type Config struct {
	Brokers    []string         // Kafka; the story's topic is made and deleted
	DSN        string           // PostgreSQL; the story's tables are made in its search_path
	Payments   int              // payments to produce
	Partitions int              // the topic's partitions
	Out        io.Writer        // the transcript
	Observer   observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	Messages      int // messages produced: the payments and the producer's duplicates
	BeforeCrash   int // payments the first worker applied before it crashed
	Applied, Rows int // distinct payments in the ledger, and its rows
}

// Run tells the story and returns its report, or an error if a payment
// was not applied exactly once.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if len(cfg.Brokers) == 0 || cfg.Payments < 1 || cfg.Partitions < 1 || cfg.Out == nil {
		return Report{}, errors.New("kafkaworker: need brokers, 1 or more payments and partitions, and an Out")
	}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	run := time.Now().UnixNano()
	topic, group := fmt.Sprintf("payments-%d", run), fmt.Sprintf("ledger-%d", run)
	ledger := pgx.Identifier{fmt.Sprintf("ledger_%d", run)}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (payment text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return Report{}, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+ledger)
	in, err := inbox.New(pool, group, inbox.WithObserver(cfg.Observer), inbox.WithMaxBatch(25), inbox.WithBatchWait(10*time.Millisecond))
	if err != nil {
		return Report{}, err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return Report{}, err
	}

	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	admin := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: tr}
	created, err := admin.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: cfg.Partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = created.Errors[topic]
	}
	if err != nil {
		return Report{}, fmt.Errorf("kafkaworker: create topic %s: %w", topic, err)
	}
	defer admin.DeleteTopics(context.WithoutCancel(ctx), &kafka.DeleteTopicsRequest{Topics: []string{topic}})

	// Produce the payments, keyed by account, a tenth of them twice (a
	// producer that retried: same id, new offset).
	w := &kafka.Writer{Addr: kafka.TCP(cfg.Brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Transport: tr}
	var msgs []kafka.Message
	for i := 0; i < cfg.Payments; i++ {
		m := kafka.Message{Key: fmt.Appendf(nil, "acct-%d", i%37), Value: []byte("100"), Headers: []kafka.Header{{Key: "id", Value: []byte(uuid.NewString())}}} // the payment's id, made by its producer
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m)
		}
	}
	err = writeRetrying(ctx, w, msgs)
	w.Close()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Messages: len(msgs)}
	fmt.Fprintf(cfg.Out, "   produced %d messages for %d payments over %d partitions\n", len(msgs), cfg.Payments, cfg.Partitions)

	apply := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2::bigint)`, string(m.Headers[0].Value), string(m.Value))
		return err
	}
	count := func() error {
		return pool.QueryRow(ctx, `SELECT count(DISTINCT payment), count(*) FROM `+ledger).Scan(&rep.Applied, &rep.Rows)
	}
	// First worker: crashes about halfway, before committing any offset
	// to Kafka: everything will be delivered again.
	crashing := noCommit{newReader(cfg.Brokers, topic, group)}
	ctx1, crash := context.WithCancel(ctx)
	defer crash()
	var handled atomic.Int64
	applyThenCrash := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if handled.Add(1) == int64(len(msgs)/2) {
			crash() // the batches in flight finish or fail; nothing more starts
		}
		return apply(ctx, tx, m)
	}
	if err := in.Run(ctx1, crashing, applyThenCrash); err != nil {
		return rep, err
	}
	crashing.Close()
	if err := count(); err != nil {
		return rep, err
	}
	rep.BeforeCrash = rep.Applied
	fmt.Fprintf(cfg.Out, "   worker 1 applied %d payments, then crashed with no Kafka offset committed\n", rep.BeforeCrash)

	// Second worker: gets every message again; the inbox skips what ran.
	r := newReader(cfg.Brokers, topic, group)
	defer r.Close()
	ctx2, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- in.Run(ctx2, r, apply)
	}()
	for deadline := time.Now().Add(time.Minute); rep.Applied < cfg.Payments && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		if err := count(); err != nil {
			stop()
			<-done
			return rep, err
		}
	}
	stop()
	if err := <-done; err != nil {
		return rep, err
	}
	if err := count(); err != nil {
		return rep, err
	}
	fmt.Fprintf(cfg.Out, "   worker 2 received everything again: %d payments applied, %d ledger rows\n", rep.Applied, rep.Rows)
	if rep.Applied != cfg.Payments || rep.Rows != cfg.Payments {
		return rep, fmt.Errorf("kafkaworker: %d payments applied in %d ledger rows, want %d applied once each", rep.Applied, rep.Rows, cfg.Payments)
	}
	return rep, nil
}

func newReader(brokers []string, topic, group string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, JoinGroupBackoff: 200 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
}

// noCommit is a reader that never commits offsets: a worker that crashes
// after its transactions but before telling Kafka.
type noCommit struct{ *kafka.Reader }

func (noCommit) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// writeRetrying writes msgs, retrying while the new topic's partitions
// get their leaders.
func writeRetrying(ctx context.Context, w *kafka.Writer, msgs []kafka.Message) error {
	var err error
	for i := 0; i < 50; i++ {
		if err = w.WriteMessages(ctx, msgs...); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}
