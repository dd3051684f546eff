package partition_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL and
// Kafka from KAFKA_BROKERS (stand-ins for your own). ExampleConsumer_Run
// runs against the test services with its Output checked; the replay
// tool's example needs parked messages first, so TestExamples prepares
// them, runs it and checks what it prints.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// One member of a consumer group applying transfers to balances: each
// batch commits with the partition's next offset, in a transaction that
// first checks this worker's epoch, so a member that paused past its
// session cannot apply a batch the group gave to another. Cancelling
// Run's context lets the batch in flight commit and leaves the group.
func ExampleConsumer_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (account text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	topic := os.Getenv("KAFKA_TOPIC") // "transfers"
	tr := &kafka.Transport{}          // the Writer's connections, closed when done
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr}
	if err := w.WriteMessages(ctx,
		kafka.Message{Key: []byte("alice"), Value: []byte("500")},
		kafka.Message{Key: []byte("bob"), Value: []byte("250")},
		kafka.Message{Key: []byte("alice"), Value: []byte("-125")},
	); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()

	c, err := partition.New(pool, brokers, "balances", []string{topic})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	err = c.Run(runCtx, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs { // one partition's, in offset order
			cents, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				return err // retried, then parked; the partition goes on
			}
			if _, err := tx.Exec(ctx, `INSERT INTO balances VALUES ($1, $2)
				ON CONFLICT (account) DO UPDATE SET cents = balances.cents + EXCLUDED.cents`, string(m.Key), cents); err != nil {
				return err
			}
		}
		if msgs[len(msgs)-1].Offset == 2 {
			stop() // the third transfer's batch: it still commits before Run returns
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	rows, _ := pool.Query(ctx, `SELECT account, cents FROM balances ORDER BY account`)
	for rows.Next() {
		var account string
		var cents int64
		_ = rows.Scan(&account, &cents)
		fmt.Println(account, cents)
	}
	// Output:
	// alice 375
	// bob 250
}

// An operator's tool for the balances group's parked messages, run once a
// fix is deployed: it lists them, replays each with the fixed Handler,
// and purges what the fix cannot apply. New does no I/O and the
// parked calls talk to PostgreSQL only, so the tool needs no Kafka and
// does not join the group.
func ExampleConsumer_ReplayParked() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	apply := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error { // the fixed handler
		for _, m := range msgs {
			amount, err := strconv.ParseInt(string(m.Value), 10, 64)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, string(m.Key), amount); err != nil {
				return err
			}
		}
		return nil
	}
	c, err := partition.New(pool, []string{"127.0.0.1:9092"}, "balances", []string{"transfers"}) // the group's; no Kafka I/O
	if err != nil {
		log.Fatal(err)
	}
	parked, err := c.ListParked(ctx, partition.ParkedID{}, 100) // a page; pass the last ID for the next
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range parked {
		fmt.Printf("%s key %s, %d attempts: %s\n", p.ID, p.Msg.Key, p.Attempts, p.Error)
		// p.Msg holds the key, value and headers as stored.
		err := c.ReplayParked(ctx, p.ID, apply) // the fixed handler: applied once, however many replay it
		if err == nil {
			fmt.Println("  replayed")
			continue
		}
		fmt.Println("  still parked:", err)
		if err := c.PurgeParked(ctx, p.ID); err != nil { // the operator's decision: drop it
			log.Fatal(err)
		}
		fmt.Println("  purged")
	}
	if _, err := c.PurgeParkedOlderThan(ctx, 30*24*time.Hour, 1000); err != nil { // the parked table's retention: schedule it, e.g. daily
		log.Fatal(err)
	}
	var balance int64
	_ = pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 'acct-1'`).Scan(&balance)
	fmt.Println("acct-1 balance:", balance)
}

// parkForReplay is ExampleConsumer_ReplayParked's world: the balances
// group's tables, with two transfers parked by a worker whose handler
// found the account frozen.
func parkForReplay(t *testing.T, dsn string) {
	ctx := context.Background()
	pool := testenv.Pool(t, dsn, 4)
	c, err := partition.New(pool, []string{"127.0.0.1:9092"}, "balances", []string{"transfers"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)`,
		`INSERT INTO accounts VALUES ('acct-1', 100)`,
		`INSERT INTO ` + partition.DefaultTable + ` (group_id, topic, partition_id, epoch, next_offset) VALUES ('balances', 'transfers', 0, 1, 7)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	cl := partition.Claim{GroupID: "balances", Topic: "transfers", Epoch: 1}
	for _, m := range []struct {
		offset int64
		value  string
	}{{7, "25"}, {8, "ten"}} {
		prev := m.offset
		msg := kafka.Message{Topic: "transfers", Offset: m.offset, Key: []byte("acct-1"), Value: []byte(m.value)}
		if err := partition.Park(ctx, c, cl, &prev, msg, errors.New("account acct-1 is frozen"), 10); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExamples runs each Example against the test services, in a fresh
// schema (DATABASE_URL) that its setup prepares.
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name  string
		setup func(t *testing.T, dsn string)
		run   func()
		want  string
	}{
		{"Consumer_ReplayParked", parkForReplay, ExampleConsumer_ReplayParked, `transfers/0@7 key acct-1, 10 attempts: account acct-1 is frozen
  replayed
transfers/0@8 key acct-1, 10 attempts: account acct-1 is frozen
  still parked: partition: handler failed on transfers/0@8: strconv.ParseInt: parsing "ten": invalid syntax
  purged
acct-1 balance: 125
`},
	} {
		t.Run(ex.name, func(t *testing.T) {
			dsn := testenv.PostgresFreshDSN(t)
			ex.setup(t, dsn)
			t.Setenv("DATABASE_URL", dsn)
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}

// The README's quickstart: one writer per partition, each batch applied
// in a transaction fenced by the worker's epoch, with the partition's
// next offset.
func ExampleConsumer_Run_quickstart() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE wallets (id text PRIMARY KEY, balance bigint);
		INSERT INTO wallets VALUES ('w7', 0), ('w8', 0)`); err != nil {
		log.Fatal(err)
	}
	brokers, topic := strings.Split(os.Getenv("KAFKA_BROKERS"), ","), os.Getenv("KAFKA_TOPIC")
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr}
	if err := w.WriteMessages(ctx, kafka.Message{Key: []byte("w7")}, kafka.Message{Key: []byte("w7")}, kafka.Message{Key: []byte("w8")}); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()
	setup, _ := partition.New(pool, brokers, "wallets", []string{topic})
	if err := setup.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	consume := func(ctx context.Context, brokers []string, topic string) error {
		c, err := partition.New(pool, brokers, "wallets", []string{topic}) // once: c.CreateSchema(ctx)
		if err != nil {
			return err
		}
		defer c.Close()
		return c.Run(ctx, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			for _, m := range msgs { // runs only while this worker's epoch is the partition's
				if _, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance + 1 WHERE id = $1`, string(m.Key)); err != nil {
					return err
				}
			}
			return nil // commits with the partition's next offset
		})
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(runCtx, brokers, topic) }()
	for last := int64(0); last == 0; { // until the message written last is applied
		select {
		case err := <-done:
			log.Fatal("Run returned early: ", err)
		case <-time.After(10 * time.Millisecond):
		}
		_ = pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE id = 'w8'`).Scan(&last)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var balance int64
	_ = pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE id = 'w7'`).Scan(&balance)
	fmt.Println("w7:", balance)
	// Output:
	// w7: 2
}

// A member of the accounts group, with batches of up to 200 messages per
// transaction, applying transfers to the accounts table.
func ExampleWithMaxBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint);
		INSERT INTO accounts VALUES ('acct-1', 0), ('acct-2', 0)`); err != nil {
		log.Fatal(err)
	}
	brokers, topic := strings.Split(os.Getenv("KAFKA_BROKERS"), ","), os.Getenv("KAFKA_TOPIC")
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr}
	transfer := func(account, amount string) kafka.Message {
		return kafka.Message{Key: []byte(account), Value: []byte(amount)}
	}
	if err := w.WriteMessages(ctx, transfer("acct-1", "100"), transfer("acct-1", "-30"), transfer("acct-2", "5")); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()
	amount := func(m kafka.Message) int64 { n, _ := strconv.ParseInt(string(m.Value), 10, 64); return n }

	consume := func(ctx context.Context) error {
		apply := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			// msgs: one partition, in offset order. Write through tx only.
			for _, m := range msgs {
				if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, string(m.Key), amount(m)); err != nil {
					return err
				}
			}
			return nil
		}
		c, err := partition.New(pool, brokers, "accounts", []string{topic},
			partition.WithMaxBatch(200)) // options: see "Settings"
		if err != nil {
			return err // partition.ErrInvalid names the bad argument or option
		}
		defer c.Close()
		if err := c.CreateSchema(ctx); err != nil { // safe from every process at once; or put partition.Schema(table) in your migrations
			return err
		}
		return c.Run(ctx, apply) // until ctx ends; nil then
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(runCtx) }()
	for last := int64(0); last == 0; { // until the transfer written last is applied
		select {
		case err := <-done:
			log.Fatal("Run returned early: ", err)
		case <-time.After(10 * time.Millisecond):
		}
		_ = pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 'acct-2'`).Scan(&last)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var balance int64
	_ = pool.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 'acct-1'`).Scan(&balance)
	fmt.Println("acct-1:", balance)
	// Output:
	// acct-1: 70
}
