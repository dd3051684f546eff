package inbox_test

// The examples are whole programs: PostgreSQL comes from DATABASE_URL (a
// stand-in for your own). They have no Output comment, so go test only
// compiles them; TestExamples runs each one against the test services and
// checks what it prints.

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"

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
}

// TestExamples runs each Example against the test services, in a fresh
// schema (DATABASE_URL).
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name string
		run  func()
		want string
	}{
		{"Inbox_Process", ExampleInbox_Process, "processed 2, duplicates 0\nprocessed 0, duplicates 2\ninvoices: 2\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			t.Setenv("DATABASE_URL", testenv.PostgresFreshDSN(t))
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}
