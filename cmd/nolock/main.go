// Command nolock runs nolock's narrated demo on the real services, measures
// the patterns against lock-based baselines on your own database, and
// prints the tables the packages need.
//
//	nolock demo [-postgres DSN] [-kafka BROKERS] [-dynamodb URL]
//	nolock bench [-dsn DSN] [-redis ADDR] [-clients 1,4,16,64] [-duration 3s] [-out bench.svg]
//	nolock schema
//
// The flags default to the variables `scripts/services env` prints
// (NOLOCK_TEST_POSTGRES, NOLOCK_TEST_KAFKA, NOLOCK_TEST_DYNAMODB,
// NOLOCK_TEST_REDIS).
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
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usage := func() {
		fmt.Fprintln(stderr, "usage: nolock demo [flags] | nolock bench [flags] | nolock schema\n\n  demo    run the narrated demo on the real services (see -h)\n  bench   measure the patterns against lock-based baselines on your database (see -h)\n  schema  print the DDL of every table the packages need")
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
	case "bench":
		fs := flag.NewFlagSet("bench", flag.ContinueOnError)
		fs.SetOutput(stderr)
		cfg := benchConfig{}
		fs.StringVar(&cfg.dsn, "dsn", os.Getenv("NOLOCK_TEST_POSTGRES"), "PostgreSQL DSN (postgres:// URL); a fresh schema is created there and dropped")
		fs.StringVar(&cfg.redis, "redis", os.Getenv("NOLOCK_TEST_REDIS"), "Redis host:port for the SET NX PX lock baseline (empty skips it)")
		clients := fs.String("clients", "1,4,16,64", "comma-separated client counts")
		fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long each scenario runs at each client count")
		fs.StringVar(&cfg.out, "out", "bench.svg", "SVG plot to write (empty writes none)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		var err error
		if cfg.clients, err = parseClients(*clients); err != nil {
			fmt.Fprintln(stderr, "nolock bench:", err)
			return 2
		}
		if _, err := bench(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "nolock bench:", err)
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
