// Command kafkaworker runs package kafkaworker's story: payments from
// Kafka applied to PostgreSQL through the transactional inbox by a worker
// that crashes before committing any offset, then by its replacement,
// which gets everything again; it exits non-zero unless every payment was
// applied exactly once.
//
//	go run ./examples/kafkaworker/cmd/kafkaworker [-kafka 127.0.0.1:19092] [-postgres postgres://…] [-payments 500] [-partitions 4]
//
// The flags default to scripts/services' variables.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/nolock/nolock/examples/kafkaworker"
)

func main() {
	brokers := flag.String("kafka", os.Getenv("NOLOCK_TEST_KAFKA"), "comma-separated Kafka brokers")
	dsn := flag.String("postgres", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN")
	payments := flag.Int("payments", 500, "payments to produce")
	partitions := flag.Int("partitions", 4, "the topic's partitions")
	flag.Parse()
	if *dsn == "" || *brokers == "" {
		log.Fatal(`no -postgres/-kafka and no NOLOCK_TEST_POSTGRES/NOLOCK_TEST_KAFKA: run scripts/services up, then eval "$(scripts/services env)"`)
	}
	_, err := kafkaworker.Run(context.Background(), kafkaworker.Config{
		Brokers: strings.Split(*brokers, ","), DSN: *dsn, Payments: *payments, Partitions: *partitions, Out: os.Stdout,
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("every payment applied exactly once")
}
