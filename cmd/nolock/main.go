// Command nolock runs nolock's narrated demo on the real services, and
// prints the tables the packages need.
//
//	nolock demo [-postgres DSN] [-kafka BROKERS] [-dynamodb URL]
//	nolock schema
//
// The flags default to the variables `scripts/services env` prints
// (NOLOCK_TEST_POSTGRES, NOLOCK_TEST_KAFKA, NOLOCK_TEST_DYNAMODB).
// The command exits non-zero when an invariant the demo checks fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, "usage: nolock demo [flags] | nolock schema\n\n  demo    run the narrated demo on the real services (see -h)\n  schema  print the DDL of every table the packages need")
	}
	if len(args) == 0 {
		usage()
		return 2
	}
	switch args[0] {
	case "demo":
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		fs.SetOutput(stderr)
		cfg := demoConfig{}
		fs.StringVar(&cfg.postgres, "postgres", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN (postgres:// URL)")
		kafka := fs.String("kafka", os.Getenv("NOLOCK_TEST_KAFKA"), "comma-separated Kafka brokers")
		fs.StringVar(&cfg.dynamodb, "dynamodb", os.Getenv("NOLOCK_TEST_DYNAMODB"), "DynamoDB endpoint URL")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if *kafka != "" {
			cfg.kafka = strings.Split(*kafka, ",")
		}
		if err := demo(ctx, cfg, stdout); err != nil {
			fmt.Fprintln(stderr, "nolock demo:", err)
			return 1
		}
		return 0
	case "schema":
		if err := schema(stdout); err != nil {
			fmt.Fprintln(stderr, "nolock schema:", err)
			return 1
		}
		return 0
	default:
		usage()
		return 2
	}
}
