package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// A finding is one line of the doctor's report.
type finding struct {
	Area   string `json:"area"`   // postgres, pooler, durability, isolation, tables, kafka, dynamodb, consumer
	Status string `json:"status"` // pass, warn or fail
	Detail string `json:"detail"` // what was found
	Fix    string `json:"fix,omitempty"`
}

const (
	pass = "pass"
	warn = "warn"
	fail = "fail"
)

type doctorConfig struct {
	postgres, dynamodb string
	kafka, topics      []string
	dynamoTables       []string
	services           []string // URLs of ParkedHandlers
	json               bool
	timeout            time.Duration
}

func doctorCommand(fs *flag.FlagSet, stdout, stderr io.Writer) func(context.Context) int {
	var cfg doctorConfig
	postgresFlag(fs, &cfg.postgres, "the database your services use, as they connect to it (through the pooler if they do)")
	kafkaFlag(fs, &cfg.kafka)
	listFlag(fs, &cfg.topics, "topic", "comma-separated Kafka `TOPICS` to check (none: the brokers only)")
	dynamodbFlag(fs, &cfg.dynamodb)
	listFlag(fs, &cfg.dynamoTables, "dynamodb-table", "comma-separated DynamoDB `TABLES` to check (none: the endpoint only)")
	serviceFlag(fs, &cfg.services)
	fs.BoolVar(&cfg.json, "json", false, "print the findings as a JSON array")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Second, "bound on each service's checks (a Go `DURATION`)")
	return func(ctx context.Context) int {
		if fs.NArg() > 0 {
			return usageError(fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
		}
		if cfg.timeout <= 0 {
			return usageError(fs, fmt.Sprintf("-timeout %v must be positive", cfg.timeout))
		}
		withEnvDefaults(&cfg.postgres, &cfg.dynamodb, &cfg.kafka)
		return runDoctor(ctx, cfg, stdout)
	}
}

// runDoctor checks each service configured and prints the findings; its
// exit status is 1 when any check failed.
func runDoctor(ctx context.Context, cfg doctorConfig, stdout io.Writer) int {
	var fs []finding
	each := func(check func(context.Context) []finding) {
		cctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		fs = append(fs, check(cctx)...)
	}
	each(func(ctx context.Context) []finding { return checkPostgres(ctx, cfg.postgres) })
	if len(cfg.kafka) > 0 {
		each(func(ctx context.Context) []finding { return checkKafka(ctx, cfg.kafka, cfg.topics) })
	}
	if cfg.dynamodb != "" {
		each(func(ctx context.Context) []finding { return checkDynamoDB(ctx, cfg.dynamodb, cfg.dynamoTables) })
	}
	for _, s := range cfg.services {
		each(func(ctx context.Context) []finding { return []finding{checkConsumer(ctx, s)} })
	}
	printFindings(stdout, fs, cfg.json)
	for _, f := range fs {
		if f.Status == fail {
			return 1
		}
	}
	return 0
}

func printFindings(w io.Writer, fs []finding, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(fs)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", strings.ToUpper(f.Status), f.Area, f.Detail)
		if f.Fix != "" {
			fmt.Fprintf(tw, "\t\tfix: %s\n", f.Fix)
		}
	}
	tw.Flush()
}

// listFlag defines a comma-separated list flag.
func listFlag(fs *flag.FlagSet, p *[]string, name, usage string) {
	fs.Func(name, usage, func(s string) error {
		*p = nil
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v != "" {
				*p = append(*p, v)
			}
		}
		return nil
	})
}
