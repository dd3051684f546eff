package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/nolock/nolock/internal/services"
)

// benchLine matches a line of `go test -bench` output for a benchmark
// measured at a client count: Benchmark<path>/clients=<N>[-<procs>],
// its iterations, then value-unit pairs.
var benchLine = regexp.MustCompile(`^Benchmark(\S+)/clients=(\d+)(?:-\d+)?\s+\d+\s+(.*)$`)

// readBenchOutput reads `go test -bench` output, as the packages'
// benchmarks print it, into a result to plot: each benchmark path
// (without "Benchmark" and "/clients=N", e.g. "Debit/exec") is a scenario,
// its rate the first metric whose unit ends in "/s", and a scenario measured
// more than once at a count (-count) is given the median. Only paths that
// re match are kept (nil: all). Lines that are not such benchmarks are
// skipped.
func readBenchOutput(r io.Reader, re *regexp.Regexp) (*benchResult, error) {
	rates := map[string]map[int][]float64{}
	var scenarios []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil || (re != nil && !re.MatchString(m[1])) {
			continue
		}
		clients, err := strconv.Atoi(m[2])
		if err != nil || clients < 1 {
			continue
		}
		rate, ok := firstRate(strings.Fields(m[3]))
		if !ok {
			continue
		}
		if rates[m[1]] == nil {
			rates[m[1]] = map[int][]float64{}
			scenarios = append(scenarios, m[1])
		}
		rates[m[1]][clients] = append(rates[m[1]][clients], rate)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(scenarios) == 0 {
		return nil, fmt.Errorf("no benchmark line with clients=N and a rate (a unit ending in /s) found%s", matchNote(re))
	}
	res := &benchResult{scenarios: scenarios, measures: map[string][]measure{}, title: benchTitle(scenarios)}
	for _, name := range scenarios {
		var counts []int
		for c := range rates[name] {
			counts = append(counts, c)
		}
		slices.Sort(counts)
		for _, c := range counts {
			res.measures[name] = append(res.measures[name], measure{clients: c, run: services.Run{Rate: median(rates[name][c])}})
			if !slices.Contains(res.clients, c) {
				res.clients = append(res.clients, c)
			}
		}
	}
	slices.Sort(res.clients)
	return res, nil
}

// benchTitle names the plot after the benchmark function when every
// scenario comes from one.
func benchTitle(scenarios []string) string {
	fn, _, _ := strings.Cut(scenarios[0], "/")
	for _, sc := range scenarios {
		if f, _, _ := strings.Cut(sc, "/"); f != fn {
			return "go test -bench: throughput vs clients"
		}
	}
	return "Benchmark" + fn + ": throughput vs clients"
}

// firstRate returns the value of the first value-unit pair whose unit
// ends in "/s".
func firstRate(fields []string) (float64, bool) {
	for i := 0; i+1 < len(fields); i += 2 {
		if strings.HasSuffix(fields[i+1], "/s") {
			v, err := strconv.ParseFloat(fields[i], 64)
			return v, err == nil && v > 0
		}
	}
	return 0, false
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func matchNote(re *regexp.Regexp) string {
	if re == nil {
		return ""
	}
	return fmt.Sprintf(" whose path matches -run %q", re)
}

// printFromTable prints the rates read from a benchmark output, one row
// per scenario, one column per client count.
func printFromTable(out io.Writer, res *benchResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\t")
	for _, c := range res.clients {
		fmt.Fprintf(tw, "clients=%d\t", c)
	}
	fmt.Fprintln(tw)
	for _, name := range res.scenarios {
		fmt.Fprintf(tw, "%s\t", name)
		byClients := map[int]float64{}
		for _, m := range res.measures[name] {
			byClients[m.clients] = m.run.Rate
		}
		for _, c := range res.clients {
			if r, ok := byClients[c]; ok {
				fmt.Fprintf(tw, "%.0f/s\t", r)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// benchFrom plots a saved benchmark output (path "-": standard input)
// instead of measuring: it prints the rates it read and writes the SVG to
// svg when that names a file.
func benchFrom(path string, re *regexp.Regexp, svg string, stdin io.Reader, out, progressOut io.Writer) error {
	in := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	res, err := readBenchOutput(in, re)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	printFromTable(out, res)
	if svg != "" {
		if err := writeSVG(svg, res); err != nil {
			return err
		}
		fmt.Fprintf(progressOut, "nolock bench: plot written to %s\n", svg)
	}
	return nil
}
