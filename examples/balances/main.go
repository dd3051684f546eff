// Command balances keeps per-account balances fed from Kafka: every event
// (account, amount) is keyed by its account, so one partition, and so one
// writer at a time, owns each account. Members of the consumer group come
// and go while the events are applied (a rolling deploy); partition.Consumer
// fences each partition's writes with its epoch and stores the offset with
// the balances, so every event lands exactly once whatever the rebalances
// do. At the end the balances are compared with the sums computed here.
//
//	go run ./examples/balances [-postgres postgres://…] [-kafka host:port] [-accounts 40] [-events 4000] [-partitions 4]
//
// The DSN and brokers default to $DATABASE_URL and $KAFKA_BROKERS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/partition"
)

func main() {
	dsn := flag.String("postgres", os.Getenv("DATABASE_URL"), "PostgreSQL DSN")
	brokers := flag.String("kafka", os.Getenv("KAFKA_BROKERS"), "Kafka brokers, comma-separated")
	accounts := flag.Int("accounts", 40, "accounts")
	events := flag.Int("events", 4000, "deposit and withdrawal events")
	partitions := flag.Int("partitions", 4, "partitions of the events topic")
	flag.Parse()
	if *dsn == "" || *brokers == "" {
		log.Fatal("no -postgres/-kafka and no DATABASE_URL/KAFKA_BROKERS")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := run(ctx, *dsn, strings.Split(*brokers, ","), *accounts, *events, *partitions); err != nil {
		log.Fatal(err)
	}
}

// apply is the Handler: it sums the batch per account and adds the sums
// to the balances, in the fenced transaction. Nothing else is needed for
// exactly-once: the fence and the offset commit with these rows.
func apply(run string) partition.Handler {
	return func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		sums := map[string]int64{}
		for _, m := range msgs {
			amount, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				return fmt.Errorf("event at offset %d: %w", m.Offset, err)
			}
			sums[string(m.Key)] += amount
		}
		ids, amounts := make([]string, 0, len(sums)), make([]int64, 0, len(sums))
		for id, a := range sums {
			ids, amounts = append(ids, id), append(amounts, a)
		}
		_, err := tx.Exec(ctx, `INSERT INTO balances (run, account, balance)
			SELECT $1, a, s FROM unnest($2::text[], $3::bigint[]) AS u(a, s)
			ON CONFLICT (run, account) DO UPDATE SET balance = balances.balance + EXCLUDED.balance`, run, ids, amounts)
		return err
	}
}

func run(ctx context.Context, dsn string, brokers []string, accounts, events, partitions int) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	runID := fmt.Sprintf("balances_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS balances (
		run text, account text, balance bigint NOT NULL, PRIMARY KEY (run, account))`); err != nil {
		return err
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	topic := runID
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	defer func() {
		_, _ = client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	}()

	// The events, and what the balances must come to.
	want := map[string]int64{}
	msgs := make([]kafka.Message, events)
	for i := range msgs {
		account := fmt.Sprintf("acct-%03d", rand.IntN(accounts))
		amount := rand.Int64N(151) - 50 // -50 … 100
		want[account] += amount
		msgs[i] = kafka.Message{Key: []byte(account), Value: []byte(strconv.FormatInt(amount, 10))}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: 500, BatchTimeout: 5 * time.Millisecond}
	// Half now, half while the members churn.
	if err := w.WriteMessages(ctx, msgs[:events/2]...); err != nil {
		return fmt.Errorf("produce: %w", err)
	}

	var claims atomic.Int64
	opts := []partition.Option{
		partition.WithHeartbeatInterval(300 * time.Millisecond), partition.WithSessionTimeout(6 * time.Second),
		partition.WithRebalanceTimeout(3 * time.Second), partition.WithBatchTimeout(2 * time.Second),
		partition.WithJoinGroupBackoff(200 * time.Millisecond),
		partition.WithOnClaim(func(partition.Claim) { claims.Add(1) }),
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	start := func(name string) (stop func()) {
		c, err := partition.New(pool, brokers, runID, []string{topic}, opts...)
		if err != nil {
			errs <- err
			return func() {}
		}
		if err := c.CreateSchema(ctx); err != nil {
			errs <- err
			return func() {}
		}
		mctx, cancel := context.WithCancel(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(mctx, apply(runID)); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
		fmt.Printf("  %s joined\n", name)
		return func() { cancel(); fmt.Printf("  %s leaving\n", name) }
	}

	fmt.Printf("applying %d events for %d accounts from %d partitions, members joining and leaving:\n", events, accounts, partitions)
	began := time.Now()
	stopA := start("member A")
	stopB := start("member B")
	time.Sleep(time.Second)
	stopA()
	if err := w.WriteMessages(ctx, msgs[events/2:]...); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	_ = w.Close()
	stopC := start("member C")

	// Done when the stored offsets account for every event.
	for {
		var applied int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(next_offset), 0) FROM `+pgx.Identifier{partition.DefaultTable}.Sanitize()+
			` WHERE group_id = $1`, runID).Scan(&applied); err != nil {
			return err
		}
		if applied == int64(events) {
			break
		}
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("%d of %d events applied: %w", applied, events, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	took := time.Since(began)
	stopB()
	stopC()
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}

	// Compare with the sums computed here.
	rows, err := pool.Query(ctx, `SELECT account, balance FROM balances WHERE run = $1`, runID)
	if err != nil {
		return err
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id  string
		bal int64
	}, error) {
		var v struct {
			id  string
			bal int64
		}
		return v, r.Scan(&v.id, &v.bal)
	})
	if err != nil {
		return err
	}
	var total, wantTotal int64
	wrong := 0
	for _, g := range got {
		total += g.bal
		if g.bal != want[g.id] {
			wrong++
		}
	}
	for _, v := range want {
		wantTotal += v
	}
	fmt.Printf("applied in %v with %d partition claims (one per partition per generation)\n", took.Round(time.Millisecond), claims.Load())
	fmt.Printf("accounts: %d, wrong balances: %d, total %d (expected %d)\n", len(got), wrong, total, wantTotal)
	if wrong != 0 || len(got) != len(want) || total != wantTotal {
		return errors.New("balances do not match the events: some were lost or applied twice")
	}
	fmt.Println("every event applied exactly once")
	return nil
}
