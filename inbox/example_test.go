package inbox_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL and
// Kafka from KAFKA_BROKERS and KAFKA_TOPIC (stand-ins for your own). Under
// go test, TestMain points them at a fresh schema and topic on the test
// services (see testenv.ExampleMain), so the examples with an Output
// comment run and their Output is checked.
// ExampleInbox_ReplayParked needs parked messages first, so it has no Output
// comment: TestExamples parks two and runs it in a schema of its own.

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// Kafka delivers a batch again after a consumer crash: the messages
// recorded with their effects are skipped, so each effect applies once.
func ExampleInbox_Process() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool, "billing")
	if err != nil {
		log.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (payload text)`); err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1)`, m.Value) // same transaction as the record
		return err
	}
	msg := func(id string) kafka.Message { // the producer's message ID in the "id" header
		return kafka.Message{Topic: "orders", Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}, Value: []byte(id)}
	}
	batch := []kafka.Message{msg("order-41"), msg("order-42")}
	for range 2 { // the second delivery is Kafka's redelivery
		out, err := in.Process(ctx, batch, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("processed %d, duplicates %d\n", out.Processed, out.Duplicates)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&n)
	fmt.Println("invoices:", n)
	// Output:
	// processed 2, duplicates 0
	// processed 0, duplicates 2
	// invoices: 2
}

// A consumer of the orders topic: the producer sent one order twice (a
// retry after a lost acknowledgement), and the inbox applies it once.
// Run commits offsets to Kafka only after the batch's transaction, so a
// crash redelivers, and the redelivery is skipped the same way.
func ExampleInbox_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	brokers, topic := strings.Split(os.Getenv("KAFKA_BROKERS"), ","), os.Getenv("KAFKA_TOPIC")
	tr := &kafka.Transport{} // the Writer's connections, closed when done
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr}
	order := func(id, amount string) kafka.Message {
		return kafka.Message{Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}, Value: []byte(amount)}
	}
	if err := w.WriteMessages(ctx, order("o-1", "120"), order("o-2", "80"), order("o-1", "120")); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()

	in, err := inbox.New(pool, "billing") // the consumer's name: each message is applied once for it
	if err != nil {
		log.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "billing", Topic: topic,
		MaxWait: time.Second}) // Close waits for the fetch in flight: up to MaxWait
	defer r.Close()
	runCtx, stop := context.WithCancel(ctx)
	err = in.Run(runCtx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1, $2)`, m.Headers[0].Value, m.Value)
		if string(m.Headers[0].Value) == "o-2" {
			stop() // its transaction still commits; the copy of o-1 never reaches the handler
		}
		return err
	})
	if err != nil { // nil once ctx ends
		log.Fatal(err)
	}
	var n, total int64
	_ = pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM orders`).Scan(&n, &total)
	fmt.Println("orders:", n, "total:", total)
	// Output:
	// orders: 2 total: 200
}

// An operator's tool for the billing consumer's parked messages, run
// once a fix is deployed: list them, replay each with the fixed handler,
// purge what the fix cannot apply. Parked messages are kept until an
// operator acts; a daily PurgeParkedOlderThan bounds how long.
func ExampleInbox_ReplayParked() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool, "billing")
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error { // the fixed handler
		amount, err := strconv.ParseFloat(string(m.Value), 64)
		if err != nil {
			return inbox.Permanent(err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO invoices VALUES ($1)`, strconv.FormatFloat(amount, 'f', 2, 64))
		return err
	}
	parked, err := in.ListParked(ctx, inbox.ParkedID{}, 100) // a page; pass the last ID for the next
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range parked {
		fmt.Printf("%s (%s, %d attempt): %s\n", p.ID, p.MessageID, p.Attempts, p.Error)
		// p.Msg holds the key, value and headers as stored.
		err := in.ReplayParked(ctx, p.ID, charge) // the fixed handler: applied once, however many replay it
		if err == nil {
			fmt.Println("  replayed")
			continue
		}
		fmt.Println("  still parked:", err)
		if err := in.PurgeParked(ctx, p.ID); err != nil { // the operator's decision: drop it
			log.Fatal(err)
		}
		fmt.Println("  purged")
	}
	if _, err := in.PurgeParkedOlderThan(ctx, 30*24*time.Hour, 1000); err != nil { // the parked table's retention: schedule it, e.g. daily
		log.Fatal(err)
	}
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM invoices`).Scan(&n)
	fmt.Println("invoices:", n)
}

// An admin endpoint for the billing consumer's parked messages, mounted
// in the service that runs the consumer: `nolock parked replay -service
// URL ID` then replays with the service's own handler, exactly once.
func ExampleParkedHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	in, err := inbox.New(pool, "billing")
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoices VALUES ($1)`, string(m.Value))
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/parked/", inbox.ParkedHandler(in, charge)) // behind your own authentication
	srv := httptest.NewServer(mux)                                // your service's admin listener
	defer srv.Close()

	for range 2 { // what `nolock parked replay -service URL/admin/parked/ orders/0@41` sends
		resp, err := http.Post(srv.URL+"/admin/parked/replay?id=orders/0@41", "", nil)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println("replay:", resp.Status)
	}
}

// parkForReplay is ExampleInbox_ReplayParked's world: the billing
// consumer's tables, with two messages parked by a handler that refused
// decimals.
func parkForReplay(t *testing.T, dsn string) {
	pool := testenv.Pool(t, dsn, 4)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE invoices (amount text)`); err != nil {
		t.Fatal(err)
	}
	order := func(id string, offset int64, amount string) kafka.Message {
		return kafka.Message{Topic: "orders", Offset: offset, Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}, Value: []byte(amount)}
	}
	runSlice(t, in, []kafka.Message{order("order-41", 41, "41.50"), order("order-42", 42, "forty-two")},
		func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			return inbox.Permanent(fmt.Errorf("amount %q is not in cents", m.Value))
		}, func() bool { return parked.Load() == 2 })
}

// TestExamples runs each Example against the test services, in a fresh
// schema (DATABASE_URL).
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name  string
		setup func(t *testing.T, dsn string)
		run   func()
		want  string
	}{
		{"ParkedHandler", parkForReplay, ExampleParkedHandler, "replay: 200 OK\nreplay: 404 Not Found\n"},
		{"Inbox_ReplayParked", parkForReplay, ExampleInbox_ReplayParked, `orders/0@41 (order-41, 1 attempt): amount "41.50" is not in cents
  replayed
orders/0@42 (order-42, 1 attempt): amount "forty-two" is not in cents
  still parked: inbox: handler failed on orders/0@42: strconv.ParseFloat: parsing "forty-two": invalid syntax
  purged
invoices: 1
`},
	} {
		t.Run(ex.name, func(t *testing.T) {
			dsn := testenv.PostgresFreshDSN(t)
			if ex.setup != nil {
				ex.setup(t, dsn)
			}
			t.Setenv("DATABASE_URL", dsn)
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}

// The README's quickstart: a consumer whose effects apply once per message
// id, reading committed records only. The producer sent payment p-1 twice
// (a retry after a lost acknowledgement): the wallet is credited once.
func ExampleInbox_Run_quickstart() {
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
	payment := func(id, wallet string) kafka.Message {
		return kafka.Message{Key: []byte(wallet), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}}
	}
	if err := w.WriteMessages(ctx, payment("p-1", "w7"), payment("p-2", "w7"), payment("p-1", "w7"), payment("p-3", "w8")); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()
	setup, _ := inbox.New(pool, "payments")
	if err := setup.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	consume := func(ctx context.Context, brokers []string, topic string) error {
		in, err := inbox.New(pool, "payments") // once: in.CreateSchema(ctx)
		if err != nil {
			return err
		}
		defer in.Close()
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: "payments", Topic: topic,
			IsolationLevel: kafka.ReadCommitted, // committed records only: Run's doc asks for it
			MaxWait:        time.Second})        // Close waits for a fetch in flight: up to MaxWait
		defer r.Close()
		// Each message's id (its "id" header) commits with its effect: a redelivery is skipped.
		return in.Run(ctx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			_, err := tx.Exec(ctx, `UPDATE wallets SET balance = balance + 1 WHERE id = $1`, string(m.Key))
			return err
		})
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(runCtx, brokers, topic) }()
	for last := int64(0); last == 0; { // until p-3, written last, is applied
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

// A ledger consumer with batches of up to 100 messages per transaction:
// each payment id is applied once, and the duplicate the producer sent is
// skipped.
func ExampleWithMaxBatch() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (payment text PRIMARY KEY, amount bigint)`); err != nil {
		log.Fatal(err)
	}
	brokers, topic := strings.Split(os.Getenv("KAFKA_BROKERS"), ","), os.Getenv("KAFKA_TOPIC")
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr}
	payment := func(id, amount string) kafka.Message {
		return kafka.Message{Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}, Value: []byte(amount)}
	}
	if err := w.WriteMessages(ctx, payment("pay-1", "250"), payment("pay-2", "100"), payment("pay-1", "250"), payment("pay-3", "50")); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()
	paymentID := func(m kafka.Message) string { return string(m.Headers[0].Value) }
	amount := func(m kafka.Message) int64 { n, _ := strconv.ParseInt(string(m.Value), 10, 64); return n }
	group := "ledger"

	consume := func(ctx context.Context) error {
		in, err := inbox.New(pool, group, inbox.WithMaxBatch(100), inbox.WithBatchWait(10*time.Millisecond)) // consumer name: usually the group ID
		if err != nil {
			return err
		}
		defer in.Close()
		if err := in.CreateSchema(ctx); err != nil { // safe from every process at once; or put in.Schema() in your migrations
			return err
		}
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: brokers, Topic: topic, GroupID: group,
			IsolationLevel: kafka.ReadCommitted,
			MaxWait:        time.Second, // Close waits for a fetch in flight: up to MaxWait
		})
		defer r.Close()
		return in.Run(ctx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (payment, amount) VALUES ($1, $2)`, paymentID(m), amount(m))
			return err // all work through tx
		})
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consume(runCtx) }()
	for last := 0; last == 0; { // until pay-3, written last, is applied
		select {
		case err := <-done:
			log.Fatal("Run returned early: ", err)
		case <-time.After(10 * time.Millisecond):
		}
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE payment = 'pay-3'`).Scan(&last)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}
	var n, total int64
	_ = pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM ledger WHERE payment LIKE 'pay-%'`).Scan(&n, &total)
	fmt.Println("payments:", n, "total:", total)
	// Output:
	// payments: 3 total: 400
}
