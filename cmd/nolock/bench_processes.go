package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/services"
)

// A hot key across processes: the bench's clients spread over up to
// benchProcesses processes of this binary, each with its own pool, its own
// Stock and its share of the cores (GOMAXPROCS, unless the caller set it),
// as replicas of a service are. The parent starts them, waits until each
// is connected, lets them all go at once, and adds up what they report.

// benchProcesses is how many processes a multi-process scenario spreads
// its clients over (fewer when there are fewer clients).
const benchProcesses = 8

// The multi-process scenarios' names.
const (
	benchBareProcesses  = "bare UPDATE, ≤8 processes"
	benchHomesProcesses = "conditional.Stock, ≤8 processes, homes"
)

// The environment of a bench process. envBenchChild names its mode
// ("bare" or "homes"); without it this binary is the nolock command.
const (
	envBenchChild    = "NOLOCK_BENCH_CHILD"
	envBenchDSN      = "NOLOCK_BENCH_DSN"
	envBenchKey      = "NOLOCK_BENCH_KEY"
	envBenchClients  = "NOLOCK_BENCH_CLIENTS"
	envBenchHome     = "NOLOCK_BENCH_HOME"
	envBenchDuration = "NOLOCK_BENCH_DURATION"
)

// A bench process runs its scenario and exits before the command starts.
func init() {
	if mode := os.Getenv(envBenchChild); mode != "" {
		os.Exit(benchChild(context.Background(), mode, os.Stdin, os.Stdout, os.Stderr))
	}
}

// processTrial is a scenario whose clients run in benchProcesses processes:
// mode "bare" runs the bare conditional UPDATE on a plain row, mode
// "homes" Stock.Take over benchProcesses buckets, process i at home i.
func processTrial(mode string) func(ctx context.Context, env *benchEnv) (trial, error) {
	return func(ctx context.Context, env *benchEnv) (trial, error) {
		var tr trial
		var key string
		var err error
		if mode == "bare" {
			key, tr.effect, err = plainRow(ctx, env)
		} else {
			key, tr.effect, tr.done, err = homesStock(ctx, env)
		}
		tr.run = func(ctx context.Context, clients int, d time.Duration) (services.Run, error) {
			return runProcesses(ctx, env.dsn, mode, key, clients, d)
		}
		return tr, err
	}
}

// homesStock stocks a fresh key over benchProcesses buckets and returns
// it, a reader of the units taken from it and the Stock's Close.
func homesStock(ctx context.Context, env *benchEnv) (string, func(context.Context) (int64, error), func(), error) {
	s, err := conditional.NewStock(env.pool, conditional.WithBuckets(benchProcesses))
	if err != nil {
		return "", nil, nil, err
	}
	key := env.unique("homes")
	if err := s.Put(ctx, key, benchStock); err != nil {
		s.Close()
		return "", nil, nil, err
	}
	return key, func(ctx context.Context) (int64, error) {
		left, err := s.Available(ctx, key)
		return benchStock - left, err
	}, func() { s.Close() }, nil
}

// runProcesses spreads clients over up to benchProcesses processes of this
// binary running mode on key for d, and returns their operations added up,
// over the longest run, with the worst process's p99.
func runProcesses(ctx context.Context, dsn, mode, key string, clients int, d time.Duration) (services.Run, error) {
	exe, err := os.Executable()
	if err != nil {
		return services.Run{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var kids []*benchKid
	defer func() {
		cancel() // kills a process still running after an error
		for _, k := range kids {
			k.wait()
		}
	}()
	procs := min(benchProcesses, clients)
	for i := range procs {
		n := clients / procs
		if i < clients%procs {
			n++
		}
		k, err := startBenchKid(ctx, exe, mode, dsn, key, i, procs, n, d)
		if err != nil {
			return services.Run{}, err
		}
		kids = append(kids, k)
	}
	for _, k := range kids {
		if _, err := k.line("ready"); err != nil {
			return services.Run{}, err
		}
	}
	for _, k := range kids {
		if _, err := io.WriteString(k.stdin, "go\n"); err != nil {
			return services.Run{}, fmt.Errorf("process %d: %w", k.i, err)
		}
	}
	var run services.Run
	for _, k := range kids {
		line, err := k.line("ops=")
		if err != nil {
			return services.Run{}, err
		}
		var ops int64
		var took, p99 time.Duration
		if _, err := fmt.Sscanf(line, "ops=%d took=%d p99=%d", &ops, &took, &p99); err != nil {
			return services.Run{}, fmt.Errorf("process %d: %q: %w", k.i, line, err)
		}
		run.Ops, run.Took, run.P99 = run.Ops+ops, max(run.Took, took), max(run.P99, p99)
	}
	for _, k := range kids {
		if err := k.wait(); err != nil {
			return services.Run{}, fmt.Errorf("process %d: %w: %s", k.i, err, strings.TrimSpace(k.stderr.String()))
		}
	}
	if run.Took > 0 {
		run.Rate = float64(run.Ops) / run.Took.Seconds()
	}
	return run, nil
}

// benchKid is one running bench process.
type benchKid struct {
	i      int
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr *strings.Builder
	once   sync.Once
	err    error
}

func startBenchKid(ctx context.Context, exe, mode, dsn, key string, i, procs, clients int, d time.Duration) (*benchKid, error) {
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), envBenchChild+"="+mode, envBenchDSN+"="+dsn, envBenchKey+"="+key,
		envBenchClients+"="+strconv.Itoa(clients), envBenchHome+"="+strconv.Itoa(i), envBenchDuration+"="+d.String())
	if os.Getenv("GOMAXPROCS") == "" {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/procs)))
	}
	k := &benchKid{i: i, cmd: cmd, stderr: &strings.Builder{}}
	cmd.Stderr = k.stderr
	var err error
	if k.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start process %d: %w", i, err)
	}
	k.lines = bufio.NewScanner(out)
	return k, nil
}

// line reads the process's output up to a line starting with prefix.
func (k *benchKid) line(prefix string) (string, error) {
	for k.lines.Scan() {
		if strings.HasPrefix(k.lines.Text(), prefix) {
			return k.lines.Text(), nil
		}
	}
	return "", fmt.Errorf("process %d ended before printing %q: %w: %s", k.i, prefix, k.wait(), strings.TrimSpace(k.stderr.String()))
}

// wait closes the process's stdin and waits for it to exit.
func (k *benchKid) wait() error {
	k.once.Do(func() {
		k.stdin.Close()
		k.err = k.cmd.Wait()
	})
	return k.err
}

// benchChild is a bench process: it connects, prints "ready", waits for a
// line on stdin, runs its clients for the duration and prints what it
// measured. It returns the exit status.
func benchChild(ctx context.Context, mode string, stdin io.Reader, stdout, stderr io.Writer) int {
	if err := benchChildRun(ctx, mode, stdin, stdout); err != nil {
		fmt.Fprintf(stderr, "nolock bench process: %v\n", err)
		return 1
	}
	return 0
}

func benchChildRun(ctx context.Context, mode string, stdin io.Reader, stdout io.Writer) error {
	clients, err := strconv.Atoi(os.Getenv(envBenchClients))
	if err != nil {
		return err
	}
	home, err := strconv.Atoi(os.Getenv(envBenchHome))
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(os.Getenv(envBenchDuration))
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(os.Getenv(envBenchDSN))
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(clients + 2) // every client a connection, plus the Stock's drainer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return err
	}
	key := os.Getenv(envBenchKey)
	var op func(ctx context.Context, client int) error
	switch mode {
	case "bare":
		op = func(ctx context.Context, _ int) error { return granted(pool.Exec(ctx, takeOne, key)) }
	case "homes":
		s, err := conditional.NewStock(pool, conditional.WithBuckets(benchProcesses), conditional.WithHome(home))
		if err != nil {
			return err
		}
		defer s.Close()
		op = func(ctx context.Context, _ int) error { return s.Take(ctx, key, 1) }
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	fmt.Fprintln(stdout, "ready")
	if _, err := bufio.NewReader(stdin).ReadString('\n'); err != nil {
		return errors.New("stdin closed before the start")
	}
	run, err := services.RunClients(ctx, clients, 0, d, op)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ops=%d took=%d p99=%d\n", run.Ops, run.Took, run.P99)
	return nil
}

// printProcessRatio prints, under the table, each multi-process Stock's
// rate over the bare UPDATE's in as many processes, at each client count.
func printProcessRatio(out io.Writer, res *benchResult) {
	bare, ok := res.measures[benchBareProcesses]
	homes, ok2 := res.measures[benchHomesProcesses]
	if !ok || !ok2 {
		return
	}
	fmt.Fprintf(out, "\n%s over %s:", benchHomesProcesses, benchBareProcesses)
	for i, m := range homes {
		fmt.Fprintf(out, "  clients=%d %.2fx", m.clients, m.run.Rate/bare[i].run.Rate)
	}
	fmt.Fprintln(out)
}
