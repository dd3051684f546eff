package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// benchOutput is go test -bench output as the packages print it, run
// twice (-count=2), with lines that are not benchmarks at client counts.
const benchOutput = `goos: linux
goarch: amd64
pkg: github.com/nolock/nolock/idempotency
BenchmarkDebit/bare/clients=1-2         	    5000	    344352 ns/op	      2904 units/s	         0 errors/op
BenchmarkDebit/bare/clients=4-2         	    5000	    169001 ns/op	      5917 units/s	         0 errors/op
BenchmarkDebit/exec/clients=1-2         	    5000	    338409 ns/op	      2955 units/s	         1.04 x-baseline	         0.99 x-bound
BenchmarkDebit/exec/clients=4-2         	    5000	    178062 ns/op	      5616 units/s	         0.92 x-baseline	         0.97 x-bound
BenchmarkDebit/bare/clients=1-2         	    5000	    344352 ns/op	      3104 units/s	         0 errors/op
BenchmarkDebit/bare/clients=4-2         	    5000	    169001 ns/op	      6117 units/s	         0 errors/op
BenchmarkDebit/exec/clients=1-2         	    5000	    338409 ns/op	      2855 units/s	         1.04 x-baseline
BenchmarkDebit/exec/clients=4-2         	    5000	    178062 ns/op	      5416 units/s	         0.92 x-baseline
BenchmarkDebit/exec/clients=16-2        	    5000	    178062 ns/op	      0.5 x-bound
BenchmarkStockSellOut/buckets=64-2      	       3	 241466541 ns/op	      8282 units/s
PASS
ok  	github.com/nolock/nolock/idempotency	61.020s
`

// -from reads each benchmark at each client count, the median of its
// runs, skips lines without a client count or a rate, keeps only what
// -run matches, and plots one line per benchmark.
func TestBenchFrom(t *testing.T) {
	res, err := readBenchOutput(strings.NewReader(benchOutput), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Debit/bare", "Debit/exec"}; strings.Join(res.scenarios, ",") != strings.Join(want, ",") {
		t.Fatalf("scenarios %q, want %q", res.scenarios, want)
	}
	if len(res.clients) != 2 || res.clients[0] != 1 || res.clients[1] != 4 {
		t.Errorf("clients %v, want [1 4] (the line at 16 has no rate)", res.clients)
	}
	for name, want := range map[string][]float64{"Debit/bare": {3004, 6017}, "Debit/exec": {2905, 5516}} {
		ms := res.measures[name]
		if len(ms) != len(want) {
			t.Fatalf("%s: %d measures, want %d", name, len(ms), len(want))
		}
		for i, m := range ms {
			if m.run.Rate != want[i] {
				t.Errorf("%s at %d clients: rate %v, want the median %v", name, m.clients, m.run.Rate, want[i])
			}
		}
	}

	only, err := readBenchOutput(strings.NewReader(benchOutput), regexp.MustCompile(`/exec$`))
	if err != nil {
		t.Fatal(err)
	}
	if len(only.scenarios) != 1 || only.scenarios[0] != "Debit/exec" {
		t.Errorf("-run /exec$ kept %q", only.scenarios)
	}
	if _, err := readBenchOutput(strings.NewReader(benchOutput), regexp.MustCompile(`nothing`)); err == nil {
		t.Error("no matching line: want an error")
	}

	dir := t.TempDir()
	in, svg := filepath.Join(dir, "bench.txt"), filepath.Join(dir, "bench.svg")
	if err := os.WriteFile(in, []byte(benchOutput), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"bench", "-from", in, "-svg", svg}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "Debit/exec") || !strings.Contains(stdout.String(), "5516/s") {
		t.Errorf("the table lacks Debit/exec's median at 4 clients:\n%s", stdout.String())
	}
	plot, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(plot), "BenchmarkDebit: throughput vs clients") {
		t.Error("the SVG's title does not name the benchmark")
	}
	if n := strings.Count(string(plot), "<path "); n != 2 {
		t.Errorf("the SVG has %d paths, want 2", n)
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"bench", "-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "-from FILE") {
		t.Errorf("bench -h: exit %d, want 0 and the flag shown as -from FILE:\n%s", code, stdout.String())
	}
	if code := run(context.Background(), []string{"bench", "-from", filepath.Join(dir, "missing.txt")}, &stdout, &stderr); code != 1 {
		t.Errorf("a missing file: exit %d, want 1", code)
	}
}
