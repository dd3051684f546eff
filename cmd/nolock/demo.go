package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/services"
)

type demoConfig struct {
	postgres, dynamodb string
	kafka              []string
}

// row is one line of the demo's final table.
type row struct {
	scenario, outcome string
	ok                bool
	took              time.Duration
}

// demo runs the services' smoke scenario: the patterns have not landed yet.
// Each step is a race a reader can check by its counts.
func demo(ctx context.Context, cfg demoConfig, out io.Writer) error {
	if cfg.postgres == "" || cfg.dynamodb == "" || len(cfg.kafka) == 0 {
		return errors.New("missing -postgres, -kafka or -dynamodb: run scripts/demo, which starts the services first")
	}
	fmt.Fprintln(out, "nolock demo: the patterns have not landed yet, so this runs the services' smoke scenario:")
	fmt.Fprintln(out, "the same races the test suite uses to prove each server is real and exact under concurrency.")
	fmt.Fprintln(out)

	const stock, workers, attempts = 500, 32, 25
	var rows []row
	step := func(name string, f func() (string, bool, error)) error {
		fmt.Fprintf(out, "- %s ...\n", name)
		start := time.Now()
		outcome, ok, err := f()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rows = append(rows, row{name, outcome, ok, time.Since(start)})
		return nil
	}

	err := step(fmt.Sprintf("PostgreSQL: %d buyers × %d tries, one conditional UPDATE on %d units", workers, attempts, stock), func() (string, bool, error) {
		schema := services.Name("nolock_demo")
		dsn, err := services.WithSearchPath(cfg.postgres, schema)
		if err != nil {
			return "", false, err
		}
		pool, err := pgxpool.New(ctx, dsn)
		if err != nil {
			return "", false, err
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
			return "", false, err
		}
		defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		r, err := services.PostgresRace(ctx, pool, "stock", stock, workers, attempts)
		return r.String(), r.Exact(stock, workers*attempts), err
	})
	if err != nil {
		return err
	}
	err = step(fmt.Sprintf("DynamoDB API: %d buyers × %d tries, one conditional UpdateItem on %d units", 8, 100, stock), func() (string, bool, error) {
		client := services.DynamoDBClient(cfg.dynamodb, nil)
		table := services.Name("nolock_demo")
		if err := services.CreateTable(ctx, client, table, false); err != nil {
			return "", false, err
		}
		defer services.DeleteTable(context.WithoutCancel(ctx), client, table)
		r, err := services.DynamoDBRace(ctx, client, table, stock, 8, 100)
		return r.String(), r.Exact(stock, 800), err
	})
	if err != nil {
		return err
	}
	const messages = 100
	err = step(fmt.Sprintf("Kafka: produce %d messages, read them back through a consumer group", messages), func() (string, bool, error) {
		topic := services.Name("nolock_demo")
		if err := services.CreateTopic(ctx, cfg.kafka, topic, 1); err != nil {
			return "", false, err
		}
		defer services.DeleteTopic(context.WithoutCancel(ctx), cfg.kafka, topic)
		n, err := services.KafkaRoundTrip(ctx, cfg.kafka, topic, topic, messages)
		return fmt.Sprintf("%d of %d read back", n, messages), n == messages, err
	})
	if err != nil {
		return err
	}

	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\toutcome\tinvariant\ttime")
	failed := 0
	for _, r := range rows {
		verdict := "holds"
		if !r.ok {
			verdict = "BROKEN"
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", r.scenario, r.outcome, verdict, r.took.Round(time.Millisecond))
	}
	tw.Flush()
	if failed > 0 {
		return fmt.Errorf("%d invariant(s) broken", failed)
	}
	return nil
}
