// Command kafkaworker applies payment messages from Kafka to PostgreSQL
// through the transactional inbox: the message's id and its effect commit
// in one transaction, so redeliveries and producer duplicates apply once.
//
//	go run ./examples/kafkaworker [-brokers 127.0.0.1:19092] [-dsn postgres://…] [-messages 500]
//
// It produces the messages itself (a tenth of them twice, as a retrying
// producer would), runs a worker that "crashes" without committing its Kafka
// offsets, restarts it, and checks that every payment was applied exactly
// once. The flags default to scripts/services' variables.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
)

func main() {
	brokers := flag.String("brokers", os.Getenv("NOLOCK_TEST_KAFKA"), "comma-separated Kafka brokers")
	dsn := flag.String("dsn", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	n := flag.Int("messages", 500, "payments to produce")
	flag.Parse()
	if err := run(context.Background(), strings.Split(*brokers, ","), *dsn, *n); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, brokers []string, dsn string, n int) error {
	if dsn == "" || brokers[0] == "" {
		return errors.New("no -dsn/-brokers: run scripts/services up, then eval \"$(scripts/services env)\"")
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	run := time.Now().UnixNano()
	topic, group := fmt.Sprintf("payments-%d", run), fmt.Sprintf("ledger-%d", run)
	ledger := pgx.Identifier{fmt.Sprintf("ledger_%d", run)}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+ledger+` (payment text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+ledger)
	in, err := inbox.New(pool, group)
	if err != nil {
		return err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return err
	}

	// Produce n payments, a tenth of them twice (a producer that retried).
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, AllowAutoTopicCreation: true, RequiredAcks: kafka.RequireAll, Transport: tr}
	var msgs []kafka.Message
	for i := 0; i < n; i++ {
		m := kafka.Message{Value: []byte("100"), Headers: []kafka.Header{{Key: "id", Value: fmt.Appendf(nil, "pay-%d", i)}}}
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m)
		}
	}
	if err := writeRetrying(ctx, w, msgs); err != nil {
		return err
	}
	w.Close()
	fmt.Printf("produced %d messages for %d payments\n", len(msgs), n)

	apply := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2::bigint)`, string(m.Headers[0].Value), string(m.Value))
		return err
	}
	// First worker: processes about half, then crashes before committing
	// any offset to Kafka: everything will be delivered again.
	var seen atomic.Int64
	crashing := &noCommit{Reader: newReader(brokers, topic, group), seen: &seen}
	ctx1, crash := context.WithCancel(ctx)
	defer crash()
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx1, crashing, apply, inbox.WithBatch(20, 10*time.Millisecond)) }()
	for seen.Load() < int64(len(msgs)/2) {
		time.Sleep(10 * time.Millisecond)
	}
	crash()
	if err := <-done; err != nil {
		return err
	}
	crashing.Close()
	fmt.Printf("worker 1 crashed after %d messages, with no offset committed\n", seen.Load())

	// Second worker: gets every message again; the inbox skips what ran.
	r := newReader(brokers, topic, group)
	defer r.Close()
	ctx2, stop := context.WithCancel(ctx)
	defer stop()
	go func() { done <- in.Run(ctx2, r, apply, inbox.WithBatch(20, 10*time.Millisecond)) }()
	deadline := time.Now().Add(time.Minute)
	var applied int
	for applied < n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		if err := pool.QueryRow(ctx, `SELECT count(DISTINCT payment) FROM `+ledger).Scan(&applied); err != nil {
			return err
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+ledger).Scan(&rows); err != nil {
		return err
	}
	fmt.Printf("worker 2 done: %d payments, %d ledger rows\n", applied, rows)
	if applied != n || rows != n {
		return fmt.Errorf("want %d payments applied once each", n)
	}
	fmt.Println("every payment applied exactly once")
	return nil
}

func newReader(brokers []string, topic, group string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group,
		StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond, JoinGroupBackoff: 200 * time.Millisecond})
}

// noCommit is a reader that never commits offsets: a worker that crashes
// after its transactions but before telling Kafka.
type noCommit struct {
	*kafka.Reader
	seen *atomic.Int64
}

func (r *noCommit) FetchMessage(ctx context.Context) (kafka.Message, error) {
	m, err := r.Reader.FetchMessage(ctx)
	if err == nil {
		r.seen.Add(1)
	}
	return m, err
}

func (r *noCommit) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// writeRetrying writes msgs, retrying while the auto-created topic gets its
// leader.
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
