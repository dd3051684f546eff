package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// demoSchemas counts the schemas demos have made and not dropped.
func demoSchemas(t *testing.T) int {
	t.Helper()
	var n int
	if err := testenv.Postgres(t).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'nolock\_demo%'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// SIGTERM stops the demo as Ctrl-C does: it exits 1 and drops the schema
// it made.
func TestDemoSIGTERM(t *testing.T) {
	dsn := testenv.PostgresDSN(t)
	before := demoSchemas(t)
	child := testenv.StartChild(t, "TestDemoChild", "NOLOCK_DEMO_DSN="+dsn)
	child.WaitFor("== wallet", 2*time.Minute)
	if n := demoSchemas(t); n != before+1 {
		t.Fatalf("%d demo schemas while it runs, want %d", n, before+1)
	}
	child.Terminate()
	if line := child.WaitFor("exit ", time.Minute); line != "exit 1" {
		t.Fatalf("the demo ended with %q, want exit 1", line)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := demoSchemas(t); n != before {
		t.Fatalf("%d demo schemas after SIGTERM, want %d: the demo left its schema behind", n, before)
	}
}

// TestDemoChild is TestDemoSIGTERM's demo process: main's signal handling
// around the wallet scene.
func TestDemoChild(t *testing.T) {
	testenv.ChildOnly(t)
	ctx, stop := signalContext()
	defer stop()
	code := run(ctx, []string{"demo", "-postgres", os.Getenv("NOLOCK_DEMO_DSN"), "-run", "^wallet$"}, os.Stdout, os.Stderr)
	fmt.Println("exit", code)
}

// -run picks scenes; one whose service is not given is skipped with a
// line that names it; a pattern that matches nothing is a usage error.
func TestDemoRun(t *testing.T) {
	if code, _, stderr := runArgs(t, "demo", "-run", "nomatch"); code != 2 || !strings.Contains(stderr, `"flash sale"`) {
		t.Fatalf("-run nomatch: exit %d, stderr %q; want 2 and the scenes' names", code, stderr)
	}
	code, stdout, stderr := runArgs(t, "demo", "-postgres", testenv.PostgresDSN(t), "-run", "kafka worker|nightly")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"== kafka worker: skipped, it needs Kafka (-kafka BROKERS)", "== nightly cron: skipped, it needs DynamoDB (-dynamodb URL)"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "== wallet") {
		t.Errorf("-run ran a scene it does not match:\n%s", stdout)
	}
}
