package main

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/observe"
)

// demoConfig is where the demo runs. An empty postgres is pgx's default
// connection (the PG* variables); a scene that needs Kafka or DynamoDB is
// skipped when kafka or dynamodb is empty.
type demoConfig struct {
	postgres, dynamodb string
	kafka              []string
	run                *regexp.Regexp   // the scenes to run (nil: all)
	obs                observe.Observer // every scene's clients report to it (nil: none)
}

// demoEnv is what every scenario gets: a pool on a fresh schema (dropped at
// the end), the Kafka brokers, a DynamoDB client and the transcript.
type demoEnv struct {
	pool    *pgxpool.Pool
	dsn     string // the pool's DSN, search_path included
	brokers []string
	dynamo  *dynamodb.Client
	out     io.Writer
	obs     observe.Observer // for every client a scene makes
}

// row is one line of the final table: what a scenario measured and whether
// its invariant held.
type row struct {
	scenario, what, outcome string
	ok, skipped             bool
}

// scenario is one of the background article's cases, run on the real
// services: PostgreSQL always, Kafka and DynamoDB as needs says.
type scenario struct {
	name, story string
	run         func(ctx context.Context, env *demoEnv) ([]row, error)
	needs       need
}

// need is the services a scene needs besides PostgreSQL.
type need int

const (
	needKafka need = 1 << iota
	needDynamoDB
)

// missing names what env lacks of n and how to give it, or "".
func (n need) missing(env *demoEnv) string {
	var m []string
	if n&needKafka != 0 && len(env.brokers) == 0 {
		m = append(m, "Kafka (-kafka BROKERS)")
	}
	if n&needDynamoDB != 0 && env.dynamo == nil {
		m = append(m, "DynamoDB (-dynamodb URL)")
	}
	return strings.Join(m, " and ")
}

var scenarios = []scenario{
	{"paused lock holder", "A compaction leader holds a lock on DynamoDB (a lease, like a rider's pickup slip) and freezes\npast its end; another worker takes over with a higher token and commits its output. The first\nwakes and commits too: a manifest that checks nothing takes it; one that compares the lock's\ntoken (the fence) with the highest it has seen refuses it.", pausedHolder, needDynamoDB},
	{"flash sale", "5,000 buyers, 300 units of one product. A read-then-write oversells; a lock around it is\ncorrect but slow; one conditional statement per batch (coalesced) is correct and fast.", flashSale, 0},
	{"wallet", "400 payments of 100 to 299 paise from five wallets of 10,000 that cannot cover them all, each\ndelivered three times at once, each delivery retrying through cut-short attempts and lost\nreplies. The idempotency key, the debit and the ledger row commit in one transaction: a retry\nreplays the first answer; payments past a balance are declined, also once; a key reused for\nanother payment is refused.", wallet, 0},
	{"nightly cron", "Six replicas wake at 02:00 each night and try the same lock, named by date. Exactly one runs\nthe report; the others see it held and go back to sleep. On the second night the winner crashes\nmid-job; the others keep trying, and one takes the lock over a lease later and runs the report.", cron, needDynamoDB},
	{"leader-only job", "Three replicas share the invoicing job through a lease on PostgreSQL. The leader sends page after\npage, each write fenced by its token; its connection freezes past the lease, another replica takes\nover with a higher token, and the frozen leader's late page is refused by the fence.", leaderJob, 0},
	{"kafka worker", "A consumer applies 500 payments (plus producer duplicates) and crashes partway through, before\ncommitting any Kafka offset; a new consumer gets everything again. The inbox skips what was applied.", kafkaWorker, needKafka},
	{"paused partition owner", "One member owns a Kafka partition and stalls with a batch in hand, before its transaction\nbegins, past the group's rebalance timeout. The partition moves to another member, which claims a\nhigher epoch. When the first wakes, it begins its late transaction with a live context, and the\nepoch fence refuses it (partition.ErrFenced). Every offset applied once, in order.", zombie, needKafka},
}

// demo runs the scenarios cfg.run selects, prints a transcript and a table
// whose numbers a reader can check, and fails if any invariant broke. A
// scene whose service is not given is skipped with a line that says so.
func demo(ctx context.Context, cfg demoConfig, out io.Writer) error {
	selected := selectScenes(cfg.run)
	schema := services.Name("nolock_demo")
	dsn, err := searchPathDSN(cfg.postgres, schema)
	if err != nil {
		return err
	}
	poolCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	poolCfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	env := &demoEnv{pool: pool, dsn: dsn, brokers: cfg.kafka, out: out, obs: cfg.obs}
	if cfg.dynamodb != "" {
		env.dynamo = services.DynamoDBClient(cfg.dynamodb, nil)
	}

	var rows []row
	for _, sc := range selected {
		if m := sc.needs.missing(env); m != "" {
			fmt.Fprintf(out, "\n== %s: skipped, it needs %s; scripts/demo starts every service locally and passes them\n", sc.name, m)
			rows = append(rows, row{scenario: sc.name, what: "skipped", outcome: "needs " + m, skipped: true})
			continue
		}
		fmt.Fprintf(out, "\n== %s\n%s\n", sc.name, sc.story)
		start := time.Now()
		rs, err := sc.run(ctx, env)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Fprintf(out, "   (%v)\n", time.Since(start).Round(100*time.Millisecond))
		for i := range rs {
			rs[i].scenario = sc.name
		}
		rows = append(rows, rs...)
	}

	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\twhat\toutcome\tinvariant")
	failed := 0
	for _, r := range rows {
		verdict := "holds"
		switch {
		case r.skipped:
			verdict = "-"
		case r.ok:
		case strings.HasPrefix(r.what, "baseline"):
			verdict = "(baseline: shown, not ours)"
		default:
			verdict = "BROKEN"
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.scenario, r.what, r.outcome, verdict)
	}
	tw.Flush()
	if failed > 0 {
		return fmt.Errorf("%d invariant(s) broken", failed)
	}
	fmt.Fprintln(out, "\nevery invariant holds")
	return nil
}

// selectScenes returns the scenes whose name run matches (nil: all).
func selectScenes(run *regexp.Regexp) []scenario {
	var selected []scenario
	for _, sc := range scenarios {
		if run == nil || run.MatchString(sc.name) {
			selected = append(selected, sc)
		}
	}
	return selected
}

// sceneNames lists the scenes' names, quoted, for -run.
func sceneNames() string {
	var names []string
	for _, sc := range scenarios {
		names = append(names, strconv.Quote(sc.name))
	}
	return strings.Join(names, ", ")
}
