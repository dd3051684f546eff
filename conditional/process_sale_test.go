package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// A sale: one hot key sold by several processes, each with its own pool
// and clients, one unit per take (saleProc.units for a bare process),
// until it is sold out. The parent stocks the key, starts the processes
// (this test binary re-executed to run TestChildSale), lets them all go
// at once, and counts.

// The environment a sale's process reads.
const (
	envSaleDSN     = "NOLOCK_SALE_DSN"
	envSaleKey     = "NOLOCK_SALE_KEY"
	envSaleBare    = "NOLOCK_SALE_BARE" // "1": the bare UPDATE on table plain instead of a Stock
	envSaleOwnRow  = "NOLOCK_SALE_OWN_ROW"
	envSaleProc    = "NOLOCK_SALE_PROC"
	envSaleUnits   = "NOLOCK_SALE_UNITS"
	envSaleClients = "NOLOCK_SALE_CLIENTS"
	envSaleBuckets = "NOLOCK_SALE_BUCKETS"
	envSaleHome    = "NOLOCK_SALE_HOME" // -1: no home
	envSaleEndgame = "NOLOCK_SALE_ENDGAME"
	envSalePer     = "NOLOCK_SALE_PER"
	envSaleForward = "NOLOCK_SALE_FORWARD" // the socket of the process's writer in a forwarded sale, else ""
	envSaleWriter  = "NOLOCK_SALE_WRITER"  // "1": the process is its group's writer
	envSaleRemotes = "NOLOCK_SALE_REMOTES" // the writer's: the processes that pass it their takes
	envSaleOnly    = "NOLOCK_SALE_ONLY"    // BenchmarkStockProcesses: bare and these scenarios only
)

// saleProc is what one process of a sale runs.
type saleProc struct {
	bare    bool // the bare conditional UPDATE, no library
	ownRow  bool // bare, each client on its own row: no contention (the ceiling)
	per     int  // units a bare take takes at once (0: 1; see units)
	clients int
	buckets int
	home    int // -1: no WithHome
	endgame int64
	forward bool // pass the takes to process writer (process_forward_test.go)
	writer  int  // the index of the process that takes for this one's group when forward
}

// units is how many units one take of the process takes: per for a bare
// process, else 1.
func (p saleProc) units() int {
	if !p.bare {
		return 1
	}
	return max(p.per, 1)
}

// stockOptions are the Stock options of a process.
func (p saleProc) stockOptions() []conditional.Option {
	opts := []conditional.Option{conditional.WithBuckets(p.buckets)}
	if p.home >= 0 {
		opts = append(opts, conditional.WithHome(p.home))
	}
	if p.endgame > 0 {
		opts = append(opts, conditional.WithEndgame(p.endgame))
	}
	return opts
}

// env is the environment of process i of a sale of units of key on dsn;
// socket is its writer's in a forwarded sale, remotes the number of
// processes that pass their takes to process i.
func (p saleProc) env(dsn, key, socket string, i, remotes int, units int64) []string {
	flag := map[bool]string{false: "0", true: "1"}
	return []string{
		envSaleDSN + "=" + dsn, envSaleKey + "=" + key, envSaleProc + "=" + strconv.Itoa(i),
		envSaleUnits + "=" + strconv.FormatInt(units, 10), envSaleBare + "=" + flag[p.bare], envSaleOwnRow + "=" + flag[p.ownRow],
		envSaleClients + "=" + strconv.Itoa(p.clients), envSaleBuckets + "=" + strconv.Itoa(p.buckets),
		envSaleHome + "=" + strconv.Itoa(p.home), envSaleEndgame + "=" + strconv.FormatInt(p.endgame, 10),
		envSalePer + "=" + strconv.Itoa(p.units()), envSaleForward + "=" + socket,
		envSaleWriter + "=" + flag[p.forward && p.writer == i], envSaleRemotes + "=" + strconv.Itoa(remotes),
	}
}

// bareTake is the baseline: the bare conditional decrement of one row by
// $2 units, autocommit, no library (bench_test.go's take1 for one unit).
const bareTake = `UPDATE plain SET qty = qty - $2 WHERE key = $1 AND qty >= $2`

// TestChildSale is a sale process's body: its own pool, its own Stock
// (or the bare statement), and clients that each take p.units() at a time
// from the moment the parent sends SIGUSR1 until the key is sold out. A
// client told "sold out" reads what is left: units left then were left
// when it was told (nothing restocks during a sale), so it counts the
// answer as early and goes on. A process that sold more than the sale's
// units (an oversell) stops there. It prints the units sold and the early
// sold-out answers.
func TestChildSale(t *testing.T) {
	testenv.ChildOnly(t)
	ctx := context.Background()
	atoi := func(name string) int {
		n, err := strconv.Atoi(os.Getenv(name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return n
	}
	p := saleProc{bare: os.Getenv(envSaleBare) == "1", ownRow: os.Getenv(envSaleOwnRow) == "1", clients: atoi(envSaleClients),
		buckets: atoi(envSaleBuckets), home: atoi(envSaleHome), endgame: int64(atoi(envSaleEndgame)), per: atoi(envSalePer)}
	key, proc, units := os.Getenv(envSaleKey), atoi(envSaleProc), int64(atoi(envSaleUnits))
	count := &saleCount{home: p.home}
	pool := testenv.PoolWith(t, os.Getenv(envSaleDSN), func(cfg *pgxpool.Config) {
		cfg.MaxConns, cfg.ConnConfig.Tracer = int32(p.clients+2), count
	})
	take, left := saleOps(t, pool, p, key)
	served := func() {}
	if path := os.Getenv(envSaleForward); path != "" && os.Getenv(envSaleWriter) == "1" {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		served = serveForwarded(t, ln, atoi(envSaleRemotes), func(ctx context.Context) (bool, error) {
			ok, err := take(ctx, key)
			if err != nil {
				t.Error(err)
			}
			return ok, err
		})
	} else if path != "" {
		remoteTake, closeFn := forwardTo(t, path)
		take = func(ctx context.Context, _ string) (bool, error) { return remoteTake(ctx) }
		defer closeFn()
	}

	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	defer signal.Stop(start)
	fmt.Println("ready")
	<-start
	count.on.Store(true)
	cpu := cpuTime(t)
	var sold, early atomic.Int64
	var wg sync.WaitGroup
	for c := range p.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := key
			if p.ownRow {
				key = ownRow(key, proc, c)
			}
			for sold.Load() <= units {
				ok, err := take(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					sold.Add(int64(p.units()))
					continue
				}
				n, err := left(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if n == 0 {
					return
				}
				if early.Add(1) > 1000 {
					t.Errorf("told sold out over 1000 times while %d units were left", n)
					return
				}
			}
		}()
	}
	wg.Wait()
	served()
	fmt.Printf("sold=%d early=%d stmts=%d across=%d first-across=%d first-gathered=%d end=%d cpu=%d\n", sold.Load(), early.Load(),
		count.stmts.Load(), count.across.Load(), count.firstAcross.Load(), count.firstGathered.Load(), time.Now().UnixNano(), cpuTime(t)-cpu)
}

// ownRow is the row of client c of process proc in an own-row sale of key.
func ownRow(key string, proc, c int) string { return fmt.Sprintf("%s/%d/%d", key, proc, c) }

// saleOps returns a process's take of p.units() of a key (false: sold out)
// and its read of the units left; key is the Stock's key (the bare
// scenarios take the key they are given).
func saleOps(t *testing.T, pool *pgxpool.Pool, p saleProc, key string) (take func(context.Context, string) (bool, error), left func(context.Context, string) (int64, error)) {
	if p.bare {
		return func(ctx context.Context, key string) (bool, error) {
				tag, err := pool.Exec(ctx, bareTake, key, p.units())
				return err == nil && tag.RowsAffected() == 1, err
			}, func(ctx context.Context, key string) (int64, error) {
				var n int64
				err := pool.QueryRow(ctx, `SELECT qty FROM plain WHERE key = $1`, key).Scan(&n)
				return n, err
			}
	}
	s, err := conditional.NewStock(pool, p.stockOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return func(ctx context.Context, key string) (bool, error) {
			err := s.Take(ctx, key, 1)
			if errors.Is(err, conditional.ErrSoldOut) {
				return false, nil
			}
			return err == nil, err
		}, func(ctx context.Context, key string) (int64, error) {
			return s.Available(ctx, key)
		}
}

// saleResult is what a sale's processes reported.
type saleResult struct {
	units, sold, early, left int64
	stmts, across            int64         // the processes' statements and locks across buckets (see saleCount)
	cpu                      time.Duration // the processes' CPU time (user and system) from the start signal on
	took                     time.Duration // from the start signal to the last process's report
	tail                     time.Duration // from the first lock across buckets to the last process's report
	endgame                  time.Duration // from the first take of bucket 0 by a process at another home to the last report
}

func (r saleResult) rate() float64 { return float64(r.sold) / r.took.Seconds() }

// sale stocks units of a fresh key in schema (the bare sale on table
// plain, which it creates if needed; the others with procs[0]'s Stock
// options), runs one process per procs entry until the key is sold out,
// and returns what they reported and what is left. Each process runs
// with GOMAXPROCS set to its share of the machine's cores. It fails tb if
// a process fails; the caller checks the counts (see exact).
func sale(tb testing.TB, pool *pgxpool.Pool, schema string, units int64, procs []saleProc) saleResult {
	tb.Helper()
	ctx := context.Background()
	key := testenv.Name("sale")
	stockSale(tb, pool, key, units, procs)
	var dir string
	remotes := make([]int, len(procs))
	for i, p := range procs {
		if p.forward && dir == "" {
			dir = tb.TempDir()
		}
		if p.forward && p.writer != i {
			remotes[p.writer]++
		}
	}
	cpus := fmt.Sprint("GOMAXPROCS=", max(1, runtime.NumCPU()/len(procs)))
	kids := make([]*testenv.Child, len(procs))
	// Writers first: each listens before it is ready.
	for _, writers := range []bool{true, false} {
		for i, p := range procs {
			if (p.forward && p.writer == i) != writers {
				continue
			}
			var socket string
			if p.forward {
				socket = filepath.Join(dir, fmt.Sprintf("writer%d.sock", p.writer))
			}
			env := append(p.env(testenv.PostgresDSNFor(tb, schema), key, socket, i, remotes[i], units), cpus)
			kids[i] = testenv.StartChild(tb, "TestChildSale", env...)
		}
		for i, k := range kids {
			if k != nil && (procs[i].forward && procs[i].writer == i) == writers {
				k.WaitFor("ready", time.Minute)
			}
		}
	}
	r := saleResult{units: units}
	start := time.Now()
	for _, k := range kids {
		if err := syscall.Kill(k.Pid(), syscall.SIGUSR1); err != nil {
			tb.Fatal(err)
		}
	}
	var first, gathered, end int64 // Unix nanoseconds: the first lock across buckets, the first take after a gather, the last report
	earliest := func(at *int64, t int64) {
		if t != 0 && (*at == 0 || t < *at) {
			*at = t
		}
	}
	for i, k := range kids {
		line := strings.TrimSpace(k.WaitFor("sold=", 5*time.Minute))
		var sold, early, stmts, across, firstAcross, firstGathered, ended int64
		var cpu time.Duration
		if _, err := fmt.Sscanf(line, "sold=%d early=%d stmts=%d across=%d first-across=%d first-gathered=%d end=%d cpu=%d",
			&sold, &early, &stmts, &across, &firstAcross, &firstGathered, &ended, &cpu); err != nil {
			tb.Fatalf("process %d: %q: %v", i, line, err)
		}
		r.sold, r.early, r.stmts, r.across, r.cpu = r.sold+sold, r.early+early, r.stmts+stmts, r.across+across, r.cpu+cpu
		earliest(&first, firstAcross)
		earliest(&gathered, firstGathered)
		end = max(end, ended)
	}
	r.took = time.Since(start)
	if first != 0 {
		r.tail = time.Duration(end - first)
	}
	if gathered != 0 {
		r.endgame = time.Duration(end - gathered)
	}
	for i, k := range kids {
		if err := k.Wait(); err != nil {
			tb.Fatalf("process %d: %v", i, err)
		}
	}
	left := `SELECT coalesce(sum(qty), 0)::bigint FROM nolock_stock WHERE key = $1`
	if procs[0].bare {
		left = `SELECT coalesce(sum(qty), 0)::bigint FROM plain WHERE key = $1 OR starts_with(key, $1 || '/')`
	}
	if err := pool.QueryRow(ctx, left, key).Scan(&r.left); err != nil {
		tb.Fatal(err)
	}
	return r
}

// stockSale stocks units of key for a sale by procs: on table plain
// (created if needed) for the bare sales, one row per client for an
// own-row sale; else with procs[0]'s Stock options.
func stockSale(tb testing.TB, pool *pgxpool.Pool, key string, units int64, procs []saleProc) {
	tb.Helper()
	ctx := context.Background()
	if procs[0].bare {
		mustExec(tb, pool, `CREATE TABLE IF NOT EXISTS plain (key text PRIMARY KEY, qty bigint NOT NULL CHECK (qty >= 0)) WITH (fillfactor = 70)`)
		rows, each := []string{key}, units
		if procs[0].ownRow {
			rows = nil
			for i, p := range procs {
				for c := range p.clients {
					rows = append(rows, ownRow(key, i, c))
				}
			}
			each = units / int64(len(rows))
			if each*int64(len(rows)) != units || each%int64(procs[0].units()) != 0 {
				tb.Fatalf("%d units do not split evenly over %d rows in takes of %d", units, len(rows), procs[0].units())
			}
		}
		if _, err := pool.Exec(ctx, `INSERT INTO plain SELECT unnest($1::text[]), $2`, rows, each); err != nil {
			tb.Fatal(err)
		}
	} else {
		s, err := conditional.NewStock(pool, procs[0].stockOptions()...)
		if err != nil {
			tb.Fatal(err)
		}
		defer s.Close()
		if err := s.CreateSchema(ctx); err != nil {
			tb.Fatal(err)
		}
		if err := s.Put(ctx, key, units); err != nil {
			tb.Fatal(err)
		}
	}
}

// exact fails tb unless the sale sold exactly its units, left none and
// told nobody "sold out" while units were left.
func exact(tb testing.TB, name string, r saleResult) {
	tb.Helper()
	if r.sold != r.units || r.left != 0 || r.early != 0 {
		tb.Fatalf("%s: sold %d of %d, %d left, %d sold-out answers while units were left; want exactly %d sold, 0 left, 0 early",
			name, r.sold, r.units, r.left, r.early, r.units)
	}
}

// homes returns procs processes of clients clients each over buckets
// buckets, process i at home i % buckets.
func homes(procs, clients, buckets int, endgame int64) []saleProc {
	ps := make([]saleProc, procs)
	for i := range ps {
		ps[i] = saleProc{clients: clients, buckets: buckets, home: i % buckets, endgame: endgame}
	}
	return ps
}

// Processes with homes sell one hot key exactly: every unit sold once,
// none left, nobody told "sold out" while units were left, whether each
// process has its own home, two share one and other buckets are nobody's
// home (sold only through steals), or a process without a home takes
// random buckets beside them.
func TestStockHomesSellExactlyAcrossProcesses(t *testing.T) {
	t.Parallel()
	shared := []saleProc{
		{clients: 4, buckets: 8, home: 0},
		{clients: 4, buckets: 8, home: 0},
		{clients: 4, buckets: 8, home: 5},
		{clients: 4, buckets: 8, home: -1},
	}
	for _, tc := range []struct {
		name  string
		units int64
		procs []saleProc
	}{
		{"own homes", 2000, homes(4, 4, 4, 0)},
		{"own homes+endgame", 2000, homes(4, 4, 4, 200)},
		{"shared home, spare buckets, no home", 1500, shared},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.PostgresSchema(t, 4)
			exact(t, tc.name, sale(t, pool, schema, tc.units, tc.procs))
		})
	}
}
