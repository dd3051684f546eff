package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// runArgs runs the command line with args and returns its exit status and
// outputs.
func runArgs(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// Asking for help is not an error: every form exits 0 and prints the usage
// on stdout.
func TestHelpExitsZero(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in stdout
	}{
		{[]string{"-h"}, "nolock schema"},
		{[]string{"-help"}, "nolock schema"},
		{[]string{"--help"}, "nolock schema"},
		{[]string{"help"}, "nolock schema"},
		{[]string{"help", "demo"}, "-kafka"},
		{[]string{"help", "bench"}, "-svg"},
		{[]string{"demo", "-h"}, "-dynamodb"},
		{[]string{"bench", "-h"}, "-postgres"},
		{[]string{"bench", "--help"}, "-clients"},
		{[]string{"schema", "-h"}, "usage: nolock schema"},
		{[]string{"version", "-h"}, "usage: nolock version"},
		{[]string{"parked", "-h"}, "-service"},
		{[]string{"help", "parked"}, "ParkedHandler"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runArgs(t, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d, want 0 (stderr: %s)", code, stderr)
			}
			if !strings.Contains(stdout, tc.want) {
				t.Errorf("stdout lacks %q:\n%s", tc.want, stdout)
			}
			if strings.Contains(stdout, "CREATE TABLE") {
				t.Errorf("help printed the schema:\n%s", stdout)
			}
		})
	}
}

// A wrong command line exits 2 with the usage on stderr, before anything
// connects.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"bogus"},
		{"help", "bogus"},
		{"demo", "-bogus"},
		{"demo", "extra"},
		{"bench", "-dsn", "postgres://x"}, // the flag is -postgres
		{"bench", "-out", "x.svg"},        // the flag is -svg
		{"schema", "mysql"},
		{"schema", "postgres", "dynamodb"},
		{"version", "extra"},
	} {
		code, stdout, stderr := runArgs(t, args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if stderr == "" || stdout != "" {
			t.Errorf("%q: want the complaint on stderr only; stdout %q, stderr %q", args, stdout, stderr)
		}
	}
}

// version prints the module version: "(devel)" in a binary without one
// (a test binary is such a binary).
func TestVersion(t *testing.T) {
	code, stdout, _ := runArgs(t, "version")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	f := strings.Fields(stdout)
	if len(f) != 3 || f[0] != "nolock" || !strings.HasPrefix(f[2], "go1.") {
		t.Fatalf("version printed %q, want \"nolock <version> go1.x\"", stdout)
	}
	if f[1] != "(devel)" && !strings.HasPrefix(f[1], "v") {
		t.Errorf("module version %q, want (devel) or a semantic version", f[1])
	}
}

// The connection flags fall back to the standard variables, never to the
// test bed's NOLOCK_TEST_*; an explicit flag wins.
func TestFlagFallbacks(t *testing.T) {
	var gotDemo demoConfig
	var gotBench benchConfig
	runDemo = func(_ context.Context, cfg demoConfig, _ io.Writer) error { gotDemo = cfg; return nil }
	runBench = func(_ context.Context, cfg benchConfig, _, _ io.Writer) (*benchResult, error) {
		gotBench = cfg
		return nil, nil
	}
	t.Cleanup(func() { runDemo, runBench = demo, bench })
	for _, v := range []string{"DATABASE_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL", "KAFKA_BROKERS"} {
		t.Setenv(v, "")
	}
	t.Setenv("NOLOCK_TEST_POSTGRES", "postgres://testbed/db")
	t.Setenv("NOLOCK_TEST_DYNAMODB", "http://testbed:8000")
	t.Setenv("NOLOCK_TEST_KAFKA", "testbed:9092")

	mustRun := func(args ...string) {
		t.Helper()
		if code, _, stderr := runArgs(t, args...); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, stderr)
		}
	}

	// Nothing set: empty, so pgx reads the PG* variables; no test bed.
	mustRun("demo")
	if gotDemo.postgres != "" || gotDemo.dynamodb != "" || gotDemo.kafka != nil {
		t.Errorf("with no flags and no standard variables: %+v, want all empty", gotDemo)
	}
	mustRun("bench")
	if gotBench.postgres != "" {
		t.Errorf("bench -postgres defaulted to %q, want empty", gotBench.postgres)
	}

	t.Setenv("DATABASE_URL", "postgres://app@db.example/app")
	t.Setenv("AWS_ENDPOINT_URL", "http://aws.example")
	t.Setenv("KAFKA_BROKERS", "kb1:9092,kb2:9092")
	mustRun("demo")
	if gotDemo.postgres != "postgres://app@db.example/app" || gotDemo.dynamodb != "http://aws.example" || strings.Join(gotDemo.kafka, ",") != "kb1:9092,kb2:9092" {
		t.Errorf("demo took %+v, want $DATABASE_URL, $AWS_ENDPOINT_URL and $KAFKA_BROKERS", gotDemo)
	}
	mustRun("bench", "-clients", "2", "-duration", "1s")
	if gotBench.postgres != "postgres://app@db.example/app" || len(gotBench.clients) != 1 || gotBench.clients[0] != 2 || gotBench.svg != "" {
		t.Errorf("bench took %+v, want $DATABASE_URL, clients [2], no SVG", gotBench)
	}

	t.Setenv("AWS_ENDPOINT_URL_DYNAMODB", "http://ddb.example")
	mustRun("demo", "-postgres", "host=flag.example", "-kafka", "k1:9092, k2:9092")
	if gotDemo.postgres != "host=flag.example" || gotDemo.dynamodb != "http://ddb.example" || strings.Join(gotDemo.kafka, ",") != "k1:9092,k2:9092" {
		t.Errorf("demo took %+v, want the flags and $AWS_ENDPOINT_URL_DYNAMODB", gotDemo)
	}
}

// An empty -postgres leaves the connection to the libpq variables, as pgx
// reads them; the search path is set on top of any connection string.
func TestPostgresFromPGVariables(t *testing.T) {
	t.Setenv("PGHOST", "pg.example")
	t.Setenv("PGPORT", "6543")
	t.Setenv("PGUSER", "alice")
	t.Setenv("PGDATABASE", "shop")
	for _, tc := range []struct{ dsn, host, user string }{
		{"", "pg.example", "alice"},
		{"user=bob", "pg.example", "bob"},
		{"postgres://carol@other.example:5432/shop", "other.example", "carol"},
	} {
		dsn, err := searchPathDSN(tc.dsn, "s1")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatalf("%q: %v", dsn, err)
		}
		if cfg.Host != tc.host || cfg.User != tc.user || cfg.Database != "shop" || cfg.RuntimeParams["search_path"] != "s1" {
			t.Errorf("%q: host %q user %q database %q search_path %q; want %q, %q, shop, s1",
				tc.dsn, cfg.Host, cfg.User, cfg.Database, cfg.RuntimeParams["search_path"], tc.host, tc.user)
		}
	}
}
