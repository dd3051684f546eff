package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// The bench runs every scenario at a small size on the test services: each
// scenario has a positive rate, the stores show exactly the operations
// done (the Stock scenarios sold exactly the units they took, no
// oversell), the table names every scenario and the SVG has one line
// (one <path>) per scenario.
func TestBench(t *testing.T) {
	redisAddr := os.Getenv("NOLOCK_TEST_REDIS")
	if redisAddr == "" {
		t.Log("NOLOCK_TEST_REDIS not set: the Redis lock scenario is skipped (scripts/services up starts Redis)")
	}
	svg := filepath.Join(t.TempDir(), "bench.svg")
	var out, progress bytes.Buffer
	res, err := bench(context.Background(), benchConfig{
		postgres: testenv.PostgresFreshDSN(t), redis: redisAddr,
		clients: []int{1, 4}, duration: testenv.Scale(25 * time.Millisecond), svg: svg, // 100 ms under -race on a machine not loaded beyond the suite
	}, &out, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("\n%s", out.String())

	want := len(benchScenarios)
	if redisAddr == "" {
		want--
	}
	if len(res.scenarios) != want {
		t.Fatalf("%d scenarios ran, want %d: %v", len(res.scenarios), want, res.scenarios)
	}
	for _, name := range res.scenarios {
		ms := res.measures[name]
		if len(ms) != 2 {
			t.Errorf("%s: %d measures, want 2", name, len(ms))
		}
		for _, m := range ms {
			if m.run.Rate <= 0 || m.run.Ops <= 0 {
				t.Errorf("%s at %d clients: rate %v over %d ops, want positive", name, m.clients, m.run.Rate, m.run.Ops)
			}
			if m.effect != m.run.Ops {
				t.Errorf("%s at %d clients: %d operations succeeded, the store shows %d", name, m.clients, m.run.Ops, m.effect)
			}
		}
		if !strings.Contains(out.String(), name) {
			t.Errorf("the table has no row for %s", name)
		}
	}
	for _, name := range []string{"conditional.Stock (coalesced)", "conditional.Stock, 16 buckets"} {
		if _, ok := res.measures[name]; !ok {
			t.Errorf("no %s scenario", name)
		}
	}

	f, err := os.Open(svg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	paths, dec := 0, xml.NewDecoder(f)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
		}
	}
	if paths != len(res.scenarios) {
		t.Errorf("the SVG has %d paths, want one per scenario (%d)", paths, len(res.scenarios))
	}
}

// Bad flags are a usage error (exit 2), before anything connects.
func TestBenchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "-clients", "1,x"},
		{"bench", "-clients", "0"},
		{"bench", "-duration", "soon"},
		{"bench", "-run", "("},
		{"bench", "-run", "no such scenario"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

// -run keeps the baseline (every ratio is against it) and the scenarios
// it matches, in their order, and reaches the bench's configuration.
func TestBenchRun(t *testing.T) {
	var got []string
	saved := runBench
	t.Cleanup(func() { runBench = saved })
	runBench = func(_ context.Context, cfg benchConfig, _, _ io.Writer) (*benchResult, error) {
		for _, sc := range selectScenarios(cfg.run) {
			got = append(got, sc.name)
		}
		return nil, nil
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"bench", "-postgres", "host=nowhere", "-run", "idempotency|advisory"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := []string{"SELECT … FOR UPDATE tx", "pg_advisory_xact_lock tx", "idempotency.Do + DebitIn", "idempotency.Exec debit"}
	if !slices.Equal(got, want) {
		t.Errorf("-run ran %q, want %q", got, want)
	}
	if all := selectScenarios(nil); len(all) != len(benchScenarios) {
		t.Errorf("no -run selects %d scenarios, want all %d", len(all), len(benchScenarios))
	}
}
