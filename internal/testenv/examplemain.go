package testenv

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/services"
)

// The variables a package's runnable examples read, as a user's program
// would; ExampleMain sets them from the test services.
const (
	ExampleEnvPostgres = "DATABASE_URL"              // a DSN whose search_path is a fresh schema
	ExampleEnvDynamoDB = "AWS_ENDPOINT_URL_DYNAMODB" // read by config.LoadDefaultConfig
	ExampleEnvTable    = "DYNAMODB_TABLE"            // a fresh table whose string hash key is "pk"
	ExampleEnvKafka    = "KAFKA_BROKERS"             // comma-separated brokers
	ExampleEnvTopic    = "KAFKA_TOPIC"               // a fresh topic of one partition
)

// ExampleMain wraps m for a package's TestMain, so that its Example
// functions run against the test services and check their Output:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(testenv.ExampleMain(m, testenv.EnvPostgres))
//	}
//
// needs names the services the examples use, by the variables
// scripts/services env prints (EnvPostgres, EnvDynamoDB, EnvDynamoDBTx,
// EnvKafka). Before the tests run, Run points the variables the examples
// read at them: DATABASE_URL at a fresh schema, dropped after the run;
// AWS_ENDPOINT_URL_DYNAMODB at a proxy to the DynamoDB server (the one
// with transactions for EnvDynamoDBTx), which Run owns and closes after
// the run so that no HTTP connection outlives it, with DYNAMODB_TABLE a
// fresh table, deleted after, and dummy credentials and a region unless
// the environment has its own; KAFKA_BROKERS at the brokers, with
// KAFKA_TOPIC a fresh topic of one partition, deleted after. So the
// examples' output does not depend on earlier runs.
//
// When a service is missing, the examples are skipped (-test.skip
// ^Example) with a line naming the setup command; under Required they
// fail the run instead, before any test runs. A service that is set but
// cannot be set up fails the run.
func ExampleMain(m *testing.M, needs ...string) interface{ Run() int } {
	return exampleMain{m, needs}
}

type exampleMain struct {
	m     *testing.M
	needs []string
}

// Run sets up what the examples need, runs the tests and tears it down.
func (e exampleMain) Run() int {
	if !flag.Parsed() {
		flag.Parse()
	}
	var missing []string
	for _, name := range e.needs {
		if os.Getenv(name) == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("examples need %s: start the services with `scripts/services up` and load them with `eval \"$(scripts/services env)\"` (or run scripts/test)", strings.Join(missing, ", "))
		if Required() {
			fmt.Fprintln(os.Stderr, "FAIL:", msg)
			return 1
		}
		fmt.Fprintln(os.Stderr, "skipping", msg)
		skip := "^Example"
		if s := flag.Lookup("test.skip").Value.String(); s != "" {
			skip = s + "|" + skip
		}
		if err := flag.Set("test.skip", skip); err != nil {
			fmt.Fprintln(os.Stderr, "testenv:", err)
			return 1
		}
		return e.m.Run()
	}
	var teardown []func() error
	defer func() {
		for i := len(teardown) - 1; i >= 0; i-- {
			if err := teardown[i](); err != nil {
				fmt.Fprintln(os.Stderr, "testenv: examples:", err)
			}
		}
	}()
	for _, name := range e.needs {
		var undo func() error
		var err error
		switch name {
		case EnvPostgres:
			undo, err = examplePostgres(os.Getenv(name))
		case EnvDynamoDB, EnvDynamoDBTx:
			undo, err = exampleDynamoDB(os.Getenv(name))
		case EnvKafka:
			undo, err = exampleKafka(os.Getenv(name))
		default:
			err = fmt.Errorf("unknown service %q", name)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "FAIL: testenv: examples:", err)
			return 1
		}
		if undo != nil {
			teardown = append(teardown, undo)
		}
	}
	return e.m.Run()
}

// examplePostgres creates a fresh schema on dsn, sets DATABASE_URL to a
// DSN whose search_path is that schema, and returns what drops it.
func examplePostgres(dsn string) (func() error, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := Name("ex")
	fresh, err := services.WithSearchPath(dsn, schema)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvPostgres, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", EnvPostgres, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create schema: %w", err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return fmt.Errorf("drop schema %s: %w", schema, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			return fmt.Errorf("drop schema %s: %w", schema, err)
		}
		return nil
	}
	if err := os.Setenv(ExampleEnvPostgres, fresh); err != nil {
		return nil, firstErr(err, drop())
	}
	return drop, nil
}

// exampleDynamoDB creates a fresh table on endpoint and starts a proxy to
// it, sets the variables the examples read, and returns what deletes the
// table and closes the proxy and its connections.
func exampleDynamoDB(endpoint string) (func() error, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, fmt.Errorf("dynamodb endpoint: %w", err)
	}
	tr := services.DynamoDBTransport()
	client := services.DynamoDBClient(endpoint, &http.Client{Transport: services.OwnBody(tr)})
	table := Name("ex")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := services.CreateTable(ctx, client, table, false); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = tr
	srv := httptest.NewServer(proxy)
	undo := func() error {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := services.DeleteTable(ctx, client, table)
		tr.CloseIdleConnections()
		return err
	}
	env := map[string]string{ExampleEnvDynamoDB: srv.URL, ExampleEnvTable: table}
	for k, v := range map[string]string{"AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} {
		if os.Getenv(k) == "" {
			env[k] = v
		}
	}
	for k, v := range env {
		if err := os.Setenv(k, v); err != nil {
			return nil, firstErr(err, undo())
		}
	}
	return undo, nil
}

// exampleKafka creates a fresh topic of one partition on brokers, sets
// the variables the examples read, and returns what deletes the topic.
func exampleKafka(brokers string) (func() error, error) {
	list := strings.Split(brokers, ",")
	topic := Name("ex")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := services.CreateTopic(ctx, list, topic, 1); err != nil {
		return nil, err
	}
	undo := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return services.DeleteTopic(ctx, list, topic)
	}
	for k, v := range map[string]string{ExampleEnvKafka: brokers, ExampleEnvTopic: topic} {
		if err := os.Setenv(k, v); err != nil {
			return nil, firstErr(err, undo())
		}
	}
	return undo, nil
}

// firstErr returns the first of a and b that is not nil.
func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
