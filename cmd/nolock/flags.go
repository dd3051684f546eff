package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/nolock/nolock/internal/services"
)

// The flags shared by the commands: one name per meaning.

// postgresFlag defines -postgres. Its fallback, $DATABASE_URL, is read
// after parsing (withEnvDefaults), so that -h never prints a password; an
// empty value leaves the connection to pgx's defaults, which read the
// libpq environment variables (PGHOST, PGUSER, ...).
func postgresFlag(fs *flag.FlagSet, p *string, purpose string) {
	fs.StringVar(p, "postgres", "", "PostgreSQL `DSN`: a postgres:// URL or key=value pairs; "+purpose+"\n(default $DATABASE_URL, else the PG* variables)")
}

// dynamodbFlag defines -dynamodb; its fallbacks, the AWS SDKs' endpoint
// variables, are read after parsing (withEnvDefaults).
func dynamodbFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "dynamodb", "", "endpoint `URL` of a DynamoDB-API server\n(default $AWS_ENDPOINT_URL_DYNAMODB, else $AWS_ENDPOINT_URL)")
}

// withEnvDefaults fills the connection flags left empty from the
// environment: postgres from DATABASE_URL (else it stays empty, for the
// PG* variables), dynamodb from AWS_ENDPOINT_URL_DYNAMODB, then
// AWS_ENDPOINT_URL, kafka from KAFKA_BROKERS (comma-separated), as the
// example services read them. A nil pointer is a flag the command does
// not have.
func withEnvDefaults(postgres, dynamodb *string, kafka *[]string) {
	if kafka != nil && len(*kafka) == 0 && os.Getenv("KAFKA_BROKERS") != "" {
		*kafka = strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	}
	if postgres != nil && *postgres == "" {
		*postgres = os.Getenv("DATABASE_URL")
	}
	if dynamodb != nil && *dynamodb == "" {
		*dynamodb = os.Getenv("AWS_ENDPOINT_URL_DYNAMODB")
		if *dynamodb == "" {
			*dynamodb = os.Getenv("AWS_ENDPOINT_URL")
		}
	}
}

// kafkaFlag defines -kafka: comma-separated brokers; its fallback,
// $KAFKA_BROKERS, is read after parsing (withEnvDefaults).
func kafkaFlag(fs *flag.FlagSet, p *[]string) {
	listFlag(fs, p, "kafka", "comma-separated Kafka `BROKERS` (host:port,host:port)\n(default $KAFKA_BROKERS)")
}

// searchPathDSN returns dsn with search_path (and application_name) set
// to schema. A postgres:// URL gets them as query parameters; any other
// connection string, the empty one included, as key=value pairs, which
// pgx reads after the PG* variables, so they win.
func searchPathDSN(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return services.WithSearchPath(dsn, schema)
	}
	return strings.TrimSpace(dsn + " search_path=" + schema + " application_name=" + schema), nil
}

// runDemo and runBench run the commands once their flags are parsed; the
// tests replace them to see the configuration the flags produce.
var (
	runDemo  = demo
	runBench = bench
)

func demoCommand(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context) int {
	var cfg demoConfig
	var metricsAddr string
	postgresFlag(fs, &cfg.postgres, "a fresh schema is created there and dropped")
	kafkaFlag(fs, &cfg.kafka)
	dynamodbFlag(fs, &cfg.dynamodb)
	metricsFlag(fs, &metricsAddr)
	run := fs.String("run", "", "run only the scenes whose name matches this `REGEXP` (Go syntax; none: every scene)")
	return func(ctx context.Context) int {
		if fs.NArg() > 0 {
			return usageError(fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		}
		if *run != "" {
			re, err := regexp.Compile(*run)
			if err != nil {
				return usageError(fs, fmt.Sprintf("-run: %v", err))
			}
			if len(selectScenes(re)) == 0 {
				return usageError(fs, fmt.Sprintf("-run %q matches no scene; the scenes: %s", *run, sceneNames()))
			}
			cfg.run = re
		}
		withEnvDefaults(&cfg.postgres, &cfg.dynamodb, &cfg.kafka)
		obs, stop, err := withMetrics(metricsAddr, stderr)
		if err != nil {
			return usageError(fs, err.Error())
		}
		defer stop()
		cfg.obs = obs
		if err := runDemo(ctx, cfg, stdout); err != nil {
			fmt.Fprintln(stderr, "nolock demo:", err)
			return 1
		}
		return 0
	}
}

func benchCommand(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context) int {
	var cfg benchConfig
	postgresFlag(fs, &cfg.postgres, "a fresh schema is created there and dropped")
	fs.StringVar(&cfg.redis, "redis", "", "Redis `ADDR` (host:port) for the SET NX PX lock baseline (none: that scenario is skipped)")
	clients := fs.String("clients", "1,4,16,64", "comma-separated client `COUNTS`")
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long each scenario runs at each client count (a Go `DURATION`)")
	fs.StringVar(&cfg.svg, "svg", "", "also write the plot, an SVG `FILE`, to this path (none: no plot)")
	run := fs.String("run", "", "run only the baseline and the scenarios whose name matches this `REGEXP` (Go syntax; none: every scenario); with -from, plot only the benchmarks whose path matches it")
	from := fs.String("from", "", "measure nothing: read a package's go test -bench output from `FILE` (-: standard input) and print and plot its rates by client count")
	var metricsAddr string
	metricsFlag(fs, &metricsAddr)
	return func(ctx context.Context) int {
		if fs.NArg() > 0 {
			return usageError(fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		}
		var err error
		if *run != "" {
			if cfg.run, err = regexp.Compile(*run); err != nil {
				return usageError(fs, fmt.Sprintf("-run: %v", err))
			}
		}
		if *from != "" {
			if err := benchFrom(*from, cfg.run, cfg.svg, os.Stdin, stdout, stderr); err != nil {
				fmt.Fprintln(stderr, "nolock bench:", err)
				return 1
			}
			return 0
		}
		if cfg.run != nil && len(selectScenarios(cfg.run)) == 1 {
			return usageError(fs, fmt.Sprintf("-run %q matches no scenario; the scenarios: %s", *run, benchScenarioNames()))
		}
		if cfg.clients, err = parseClients(*clients); err != nil {
			return usageError(fs, err.Error())
		}
		if cfg.duration <= 0 {
			return usageError(fs, fmt.Sprintf("-duration %v: want a positive duration", cfg.duration))
		}
		withEnvDefaults(&cfg.postgres, nil, nil)
		obs, stop, err := withMetrics(metricsAddr, stderr)
		if err != nil {
			return usageError(fs, err.Error())
		}
		defer stop()
		cfg.obs = obs
		if _, err := runBench(ctx, cfg, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "nolock bench:", err)
			return 1
		}
		return 0
	}
}

func schemaCommand(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context) int {
	partitioned := fs.Bool("partitioned", false, "print the idempotency records and inbox ids tables partitioned by day of their UUIDv7 keys, and the function that creates the partitions")
	return func(context.Context) int {
		var err error
		switch {
		case fs.NArg() > 1:
			return usageError(fs, "nolock schema takes at most one argument")
		case fs.NArg() == 0:
			err = schema(stdout, *partitioned)
		case fs.Arg(0) == "postgres":
			err = postgresSchema(stdout, *partitioned)
		case fs.Arg(0) == "dynamodb":
			err = dynamoSchema(stdout, "")
		default:
			return usageError(fs, fmt.Sprintf("unknown schema %q: want postgres or dynamodb", fs.Arg(0)))
		}
		if err != nil {
			fmt.Fprintln(stderr, "nolock schema:", err)
			return 1
		}
		return 0
	}
}
