package conditional_test

import (
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// saleRounds alternates which scenario of BenchmarkStockProcesses goes
// first, across iterations and -count runs.
var saleRounds atomic.Int64

// BenchmarkStockProcesses sells one hot key from 8 processes of 8 clients
// each (each process its own pool and its share of the machine's cores),
// one unit per take (but in bound and bound2), until it is sold out, and
// measures units/s from the start signal to the last process's report,
// the end of the sale included. Each iteration runs every scenario (or
// bare and those named in $NOLOCK_SALE_ONLY, comma-separated), starting
// with the next one each time:
//
//	bare       the bare conditional UPDATE on one row, autocommit, no library
//	ceiling    the bare UPDATE, each client on its own row: no contention
//	coalesced  Stock on one row: each process coalesces, the processes queue on the row
//	buckets    Stock over 8 buckets, a random bucket per take, WithEndgame(1000)
//	homes      Stock over 8 buckets, process i at home i, WithEndgame(1000)
//	bound      no library: each process one client on a row of its own,
//	           taking 8 units per bare UPDATE: the commits alone of a design
//	           in which each process writes its own takes, answers each
//	           after its commit, and batches all 8 of its clients into each
//	           statement, one statement in flight per process
//	bound2     the same with two clients per process, 4 units each: two
//	           statements in flight per process
//	forward    processes pass their takes to process 0 over a Unix socket;
//	           its Stock coalesces them and its own clients' on one row (no
//	           library for the passing: see process_forward_test.go)
//	forward2   the same in two groups of 4 processes, each with its writer
//	           and its bucket (WithHome), WithEndgame(1000)
//	one        one process of all 64 clients, Stock on one row: the most a
//	           design that passes every take to one writer can sell, the
//	           passing free
//
// It reports each scenario's median units/s and, as <scenario>-x-bare,
// the median over the iterations of its rate over bare's in the same
// iteration; homes-x-bound, the same of homes over bound (the goal:
// 0.9); and, to explain the rates, medians of each scenario's statements
// a process (stmts/proc: every round trip, BEGIN and COMMIT included),
// units a statement (units/stmt), the processes' CPU time a unit
// (cpu-us/unit: the Go side, at GOMAXPROCS=1 beside the server), locks of all the key's buckets (across:
// steals and takes across buckets), the share of the sale from the
// first of those to the end (tail-%) and the share from the endgame's
// gather to the end (endgame-%: from the first take of bucket 0 by a
// process whose home is another). It fails unless every sale was
// exact: sold == stocked, nothing left, no sold-out answer while units
// were left.
//
//	go test -count 3 -run '^$' -bench StockProcesses -benchtime 3x ./conditional
func BenchmarkStockProcesses(b *testing.B) {
	const procs, clients = 8, 8
	pool, schema := testenv.PostgresSchema(b, 8)
	same := func(p saleProc) []saleProc {
		ps := make([]saleProc, procs)
		for i := range ps {
			ps[i] = p
		}
		return ps
	}
	type scenario struct {
		name  string
		units int64 // about two seconds' worth
		procs []saleProc
	}
	scenarios := []scenario{
		{"bare", 5_000, same(saleProc{bare: true, clients: clients, buckets: 1, home: -1})},
		{"ceiling", 12_800, same(saleProc{bare: true, ownRow: true, clients: clients, buckets: 1, home: -1})},
		{"coalesced", 30_000, same(saleProc{clients: clients, buckets: 1, home: -1})},
		{"buckets", 30_000, same(saleProc{clients: clients, buckets: procs, home: -1, endgame: 1000})},
		{"homes", 200_000, homes(procs, clients, procs, 1000)},
		{"bound", 200_000, same(saleProc{bare: true, ownRow: true, clients: 1, per: clients, buckets: 1, home: -1})},
		{"bound2", 200_000, same(saleProc{bare: true, ownRow: true, clients: 2, per: clients / 2, buckets: 1, home: -1})},
		{"forward", 200_000, forwarded(procs, clients, 1)},
		{"forward2", 200_000, forwarded(procs, clients, 2)},
		{"one", 200_000, []saleProc{{clients: procs * clients, buckets: 1, home: -1}}},
	}
	if only := os.Getenv(envSaleOnly); only != "" {
		names := strings.Split(only, ",")
		for _, n := range names {
			if !slices.ContainsFunc(scenarios, func(sc scenario) bool { return sc.name == n }) {
				b.Fatalf("%s: no scenario %q", envSaleOnly, n)
			}
		}
		scenarios = slices.DeleteFunc(scenarios, func(sc scenario) bool {
			return sc.name != "bare" && !slices.Contains(names, sc.name)
		})
	}
	rates := map[string][]float64{}
	ratios := map[string][]float64{}
	counts := map[string]map[string][]float64{} // scenario → metric → one value per iteration
	for range b.N {
		first := int(saleRounds.Add(1))
		for j := range scenarios {
			sc := scenarios[(first+j)%len(scenarios)]
			r := sale(b, pool, schema, sc.units, sc.procs)
			exact(b, sc.name, r)
			rates[sc.name] = append(rates[sc.name], r.rate())
			c := map[string]float64{
				"stmts/proc":  float64(r.stmts) / float64(len(sc.procs)),
				"units/stmt":  float64(r.sold) / float64(r.stmts),
				"across":      float64(r.across),
				"tail-%":      100 * r.tail.Seconds() / r.took.Seconds(),
				"endgame-%":   100 * r.endgame.Seconds() / r.took.Seconds(),
				"cpu-us/unit": float64(r.cpu.Microseconds()) / float64(r.sold),
			}
			if counts[sc.name] == nil {
				counts[sc.name] = map[string][]float64{}
			}
			for m, v := range c {
				counts[sc.name][m] = append(counts[sc.name][m], v)
			}
			b.Logf("%s: %d units in %v: %.0f units/s; %.0f statements a process, %.2f units a statement, %.1f µs of the processes' CPU a unit; %d locks across buckets, the first %v before the end; the endgame %v",
				sc.name, r.sold, r.took.Round(1e6), r.rate(), c["stmts/proc"], c["units/stmt"], c["cpu-us/unit"], r.across, r.tail.Round(1e6), r.endgame.Round(1e6))
		}
		for _, sc := range scenarios[1:] {
			ratios[sc.name] = append(ratios[sc.name], last(rates[sc.name])/last(rates["bare"]))
		}
		if len(rates["homes"]) > 0 && len(rates["bound"]) > 0 {
			ratios["homes/bound"] = append(ratios["homes/bound"], last(rates["homes"])/last(rates["bound"]))
		}
	}
	b.ReportMetric(median(rates["bare"]), "bare-units/s")
	for _, sc := range scenarios[1:] {
		b.ReportMetric(median(rates[sc.name]), sc.name+"-units/s")
		b.ReportMetric(median(ratios[sc.name]), sc.name+"-x-bare")
	}
	if rs := ratios["homes/bound"]; len(rs) > 0 {
		b.ReportMetric(median(rs), "homes-x-bound")
	}
	for _, sc := range scenarios {
		for _, m := range []string{"stmts/proc", "units/stmt", "cpu-us/unit", "across", "tail-%", "endgame-%"} {
			if vs := counts[sc.name][m]; !slices.Contains([]string{"across", "tail-%", "endgame-%"}, m) || median(vs) > 0 {
				b.ReportMetric(median(vs), sc.name+"-"+m)
			}
		}
	}
}

// last returns the last of xs.
func last(xs []float64) float64 { return xs[len(xs)-1] }

// median returns the middle of xs (the mean of the two middle ones for an
// even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// forwarded returns procs processes of clients clients each in groups,
// each group's first process the writer of all its takes: on one row for
// one group, else over a bucket per group, each group's writer at home on
// its own, WithEndgame(1000).
func forwarded(procs, clients, groups int) []saleProc {
	ps := homes(procs, clients, groups, 0)
	per := procs / groups
	for i := range ps {
		ps[i].home = i / per
		ps[i].forward, ps[i].writer = true, ps[i].home*per
		if groups == 1 {
			ps[i].home = -1
		} else {
			ps[i].endgame = 1000
		}
	}
	return ps
}
