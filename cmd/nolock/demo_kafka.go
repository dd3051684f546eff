package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/services"
)

// kafkaWorker: a consumer crashes with nothing committed to Kafka; its
// replacement gets every message again; each payment is applied once.
func kafkaWorker(ctx context.Context, env *demoEnv) ([]row, error) {
	const payments = 500
	topic, group := services.Name("nolock_demo"), services.Name("ledger")
	if err := services.CreateTopic(ctx, env.brokers, topic, 4); err != nil {
		return nil, err
	}
	defer services.DeleteTopic(context.WithoutCancel(ctx), env.brokers, topic)
	in, err := inbox.New(env.pool, group)
	if err != nil {
		return nil, err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return nil, err
	}
	if _, err := env.pool.Exec(ctx, `CREATE TABLE kafka_ledger (payment text NOT NULL)`); err != nil {
		return nil, err
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(env.brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, Transport: tr}
	var msgs []kafka.Message
	for i := 0; i < payments; i++ {
		m := kafka.Message{Key: fmt.Appendf(nil, "acct-%d", i%37), Headers: []kafka.Header{{Key: "id", Value: fmt.Appendf(nil, "pay-%d", i)}}}
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m) // the producer retried: same id, new offset
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return nil, err
	}
	w.Close()
	fmt.Fprintf(env.out, "   produced %d messages for %d payments over 4 partitions\n", len(msgs), payments)

	apply := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO kafka_ledger VALUES ($1)`, string(m.Headers[0].Value))
		return err
	}
	reader := func() *kafka.Reader {
		return kafka.NewReader(kafka.ReaderConfig{Brokers: env.brokers, Topic: topic, GroupID: group, StartOffset: kafka.FirstOffset,
			MaxWait: 100 * time.Millisecond, JoinGroupBackoff: 200 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	}
	var fetched atomic.Int64
	first := &crashingReader{Reader: reader(), fetched: &fetched}
	crashCtx, crash := context.WithCancel(ctx)
	defer crash()
	done := make(chan error, 1)
	go func() { done <- in.Run(crashCtx, first, apply, inbox.WithBatch(25, 10*time.Millisecond)) }()
	for fetched.Load() < int64(len(msgs)/2) {
		time.Sleep(10 * time.Millisecond)
	}
	crash()
	if err := <-done; err != nil {
		return nil, err
	}
	first.Close()
	var applied int64
	if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM kafka_ledger`).Scan(&applied); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   consumer 1 applied %d payments, then crashed with no Kafka offset committed\n", applied)

	second := reader()
	defer second.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { done <- in.Run(runCtx, second, apply, inbox.WithBatch(25, 10*time.Millisecond)) }()
	var distinct, rows int64
	for deadline := time.Now().Add(time.Minute); distinct < payments && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if err := env.pool.QueryRow(ctx, `SELECT count(DISTINCT payment), count(*) FROM kafka_ledger`).Scan(&distinct, &rows); err != nil {
			return nil, err
		}
	}
	stop()
	if err := <-done; err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   consumer 2 received everything again: %d payments applied, %d ledger rows\n", distinct, rows)
	return []row{{what: "crash before the offset commit (inbox)",
		outcome: fmt.Sprintf("%d messages, %d payments, %d applied, %d rows", len(msgs), payments, distinct, rows),
		ok:      distinct == payments && rows == payments}}, nil
}

// crashingReader never commits offsets: a consumer that dies after its
// transactions but before telling Kafka.
type crashingReader struct {
	*kafka.Reader
	fetched *atomic.Int64
}

func (r *crashingReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := r.Reader.FetchMessage(ctx)
	if err == nil {
		r.fetched.Add(1)
	}
	return m, err
}

func (r *crashingReader) CommitMessages(context.Context, ...kafka.Message) error { return nil }
