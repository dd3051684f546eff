package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/observe"
)

// benchConfig is what the bench runs on. An empty postgres is pgx's
// default connection (the PG* variables).
type benchConfig struct {
	postgres string
	redis    string // host:port; empty skips the Redis lock scenario
	clients  []int
	duration time.Duration
	svg      string           // the plot's path; empty writes none
	run      *regexp.Regexp   // the scenarios to run besides the baseline (nil: every one)
	obs      observe.Observer // the library's clients report to it (nil: none)
}

// parseClients parses "1,4,16,64".
func parseClients(s string) ([]int, error) {
	var cs []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 {
			return nil, fmt.Errorf("-clients: want a comma-separated list of counts from 1 to 1024, got %q", s)
		}
		cs = append(cs, n)
	}
	return cs, nil
}

// measure is one scenario at one client count: what services.RunClients
// measured, and, where the scenario can count it, the effect the database
// (or the store) shows afterwards, which must equal the operations done.
type measure struct {
	clients int
	run     services.Run
	effect  int64 // units taken / increments / debits the store shows
}

// benchResult is every scenario's measures, in scenario order.
type benchResult struct {
	title     string // the plot's title (empty: nolock bench's own)
	clients   []int
	scenarios []string
	measures  map[string][]measure // by scenario, in clients order
}

// benchEnv is what a scenario's setup gets.
type benchEnv struct {
	dsn   string // the pool's: for processes of their own
	pool  *pgxpool.Pool
	redis *redis.Client // nil when no Redis address was given
	seq   atomic.Int64  // for unique keys, tokens and idempotency keys
	obs   observe.Observer
}

func (e *benchEnv) unique(prefix string) string { return fmt.Sprintf("%s-%d", prefix, e.seq.Add(1)) }

// trial is one scenario prepared for one client count: op is timed (or,
// for a scenario whose clients run in other processes, run runs them all),
// effect reads what the store shows was done (units taken, increments,
// debits), and done releases what setup made.
type trial struct {
	op     func(ctx context.Context, client int) error
	run    func(ctx context.Context, clients int, d time.Duration) (services.Run, error)
	effect func(ctx context.Context) (int64, error)
	done   func()
}

// benchScenario is one strategy for "take one unit of one hot key".
type benchScenario struct {
	name  string
	redis bool // needs Redis
	setup func(ctx context.Context, env *benchEnv) (trial, error)
}

const (
	benchStock = int64(1e15) // never sells out within a run
	// takeOne is the bare conditional decrement every baseline wraps
	// (conditional/bench_test.go's take1).
	takeOne = `UPDATE plain SET qty = qty - 1 WHERE key = $1 AND qty >= 1`
)

// plainRow inserts a fresh hot row into the baselines' table and returns
// its key and a reader of the units taken from it.
func plainRow(ctx context.Context, env *benchEnv) (string, func(context.Context) (int64, error), error) {
	key := env.unique("hot")
	if _, err := env.pool.Exec(ctx, `INSERT INTO plain VALUES ($1, $2)`, key, benchStock); err != nil {
		return "", nil, err
	}
	return key, func(ctx context.Context) (int64, error) {
		var left int64
		err := env.pool.QueryRow(ctx, `SELECT qty FROM plain WHERE key = $1`, key).Scan(&left)
		return benchStock - left, err
	}, nil
}

func granted(tag interface{ RowsAffected() int64 }, err error) error {
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("conditional update refused")
	}
	return err
}

// stockTrial is a conditional.Stock scenario: Take one unit of one key.
func stockTrial(opts ...conditional.Option) func(ctx context.Context, env *benchEnv) (trial, error) {
	return func(ctx context.Context, env *benchEnv) (trial, error) {
		s, err := conditional.NewStock(env.pool, append(slices.Clip(opts), conditional.WithObserver(env.obs))...)
		if err != nil {
			return trial{}, err
		}
		key := env.unique("stock")
		if err := s.Put(ctx, key, benchStock); err != nil {
			s.Close()
			return trial{}, err
		}
		return trial{
			op: func(ctx context.Context, _ int) error { return s.Take(ctx, key, 1) },
			effect: func(ctx context.Context) (int64, error) {
				left, err := s.Available(ctx, key)
				return benchStock - left, err
			},
			done: func() { s.Close() },
		}, nil
	}
}

// compareAndDelete releases a Redis lock only if it still holds our token.
var compareAndDelete = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// redisLockTTL bounds how long a crashed holder blocks the others.
const redisLockTTL = 5 * time.Second

// benchScenarios are the strategies, baseline first. The baselines and
// the library calls are those of conditional/bench_test.go,
// cas/bench_test.go and idempotency/bench_test.go.
var benchScenarios = []benchScenario{
	{name: "SELECT … FOR UPDATE tx", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		key, effect, err := plainRow(ctx, env)
		return trial{op: func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
				var q int64
				if err := tx.QueryRow(ctx, `SELECT qty FROM plain WHERE key = $1 FOR UPDATE`, key).Scan(&q); err != nil {
					return err
				}
				return granted(tx.Exec(ctx, takeOne, key))
			})
		}, effect: effect}, err
	}},
	{name: "pg_advisory_xact_lock tx", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		key, effect, err := plainRow(ctx, env)
		return trial{op: func(ctx context.Context, _ int) error {
			return pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, key); err != nil {
					return err
				}
				return granted(tx.Exec(ctx, takeOne, key))
			})
		}, effect: effect}, err
	}},
	{name: "Redis SET NX PX lock", redis: true, setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		key, effect, err := plainRow(ctx, env)
		lock := services.Name("nolock_bench_lock")
		return trial{op: func(ctx context.Context, _ int) error {
			token := env.unique("token")
			// Acquire: poll with capped, jittered exponential backoff, as
			// lock clients do (0.1 ms doubling to 2 ms).
			wait := 100 * time.Microsecond
			for {
				ok, err := env.redis.SetNX(ctx, lock, token, redisLockTTL).Result()
				if err != nil {
					return fmt.Errorf("redis: acquire: %w", err)
				}
				if ok {
					break
				}
				t := time.NewTimer(wait/2 + time.Duration(env.seq.Add(1)%int64(wait/2+1)))
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
				wait = min(2*wait, 2*time.Millisecond)
			}
			uerr := granted(env.pool.Exec(ctx, takeOne, key))
			if err := compareAndDelete.Run(context.WithoutCancel(ctx), env.redis, []string{lock}, token).Err(); err != nil {
				return errors.Join(uerr, fmt.Errorf("redis: release: %w", err))
			}
			return uerr
		}, effect: effect, done: func() { env.redis.Del(context.Background(), lock) }}, err
	}},
	{name: "bare conditional UPDATE", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		key, effect, err := plainRow(ctx, env)
		return trial{op: func(ctx context.Context, _ int) error {
			return granted(env.pool.Exec(ctx, takeOne, key))
		}, effect: effect}, err
	}},
	{name: "conditional.Stock (coalesced)", setup: stockTrial()},
	{name: "conditional.Stock, 16 buckets", setup: stockTrial(conditional.WithBuckets(16))},
	{name: benchBareProcesses, setup: processTrial("bare")},
	{name: benchHomesProcesses, setup: processTrial("homes")},
	{name: "cas.Store.Update (combined)", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		backend, err := pgcas.NewBackend(env.pool)
		if err != nil {
			return trial{}, err
		}
		s, err := cas.NewStore[int64](backend, nil, cas.WithAttempts(100000), cas.WithObserver(env.obs))
		if err != nil {
			return trial{}, err
		}
		key := env.unique("counter")
		if err := s.Create(ctx, key, 0); err != nil {
			s.Close()
			return trial{}, err
		}
		incr := func(n int64) (int64, error) { return n + 1, nil }
		return trial{
			op: func(ctx context.Context, _ int) error {
				_, err := s.Update(ctx, key, incr)
				return err
			},
			effect: func(ctx context.Context) (int64, error) {
				v, err := s.Get(ctx, key)
				return v.Value, err
			},
			done: func() { s.Close() },
		}, nil
	}},
	{name: "idempotency.Do + DebitIn", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		return idempotentDebit(ctx, env, func(keys *idempotency.Store, accounts *conditional.Accounts, account string) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				_, err := keys.Do(ctx, account, env.unique("pay"), nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					return []byte("paid"), accounts.DebitIn(ctx, tx, account, 1)
				})
				return err
			}
		})
	}},
	{name: "idempotency.Exec debit", setup: func(ctx context.Context, env *benchEnv) (trial, error) {
		return idempotentDebit(ctx, env, func(keys *idempotency.Store, _ *conditional.Accounts, account string) func(context.Context, int) error {
			return func(ctx context.Context, _ int) error {
				res, err := keys.Exec(ctx, account, env.unique("pay"), nil,
					`UPDATE nolock_accounts SET balance = balance - 1 WHERE key = $1 AND bucket = 0 AND balance >= 1 RETURNING balance`, account)
				if err == nil && res.Terminal {
					err = errors.New("debit refused")
				}
				return err
			}
		})
	}},
}

// idempotentDebit is a trial debiting one hot account by 1 per operation
// under a new idempotency key each time, the operation made by op; its
// effect checks one idempotency record per debit.
func idempotentDebit(ctx context.Context, env *benchEnv, op func(*idempotency.Store, *conditional.Accounts, string) func(context.Context, int) error) (trial, error) {
	accounts, err := conditional.NewAccounts(env.pool, conditional.WithObserver(env.obs))
	if err != nil {
		return trial{}, err
	}
	keys, err := idempotency.New(env.pool, idempotency.WithObserver(env.obs))
	if err != nil {
		accounts.Close()
		return trial{}, err
	}
	account := env.unique("wallet")
	if err := accounts.Open(ctx, account, benchStock); err != nil {
		accounts.Close()
		return trial{}, err
	}
	return trial{
		op: op(keys, accounts, account),
		effect: func(ctx context.Context) (int64, error) {
			balance, err := accounts.Balance(ctx, account)
			if err != nil {
				return 0, err
			}
			var records int64
			if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM nolock_idempotency WHERE scope = $1`, account).Scan(&records); err != nil {
				return 0, err
			}
			if records != benchStock-balance {
				return 0, fmt.Errorf("%d idempotency records but %d debits", records, benchStock-balance)
			}
			return benchStock - balance, nil
		},
		done: func() { accounts.Close() },
	}, nil
}

// bench runs every scenario at every client count in a fresh schema it
// creates and drops, prints progress to progressOut and the table to out,
// and writes the SVG plot to cfg.svg when that names a file. It fails if a
// scenario errs or if the store shows a different effect than the
// operations done (an oversell, a lost or a doubled update).
func bench(ctx context.Context, cfg benchConfig, out, progressOut io.Writer) (*benchResult, error) {
	if len(cfg.clients) == 0 || cfg.duration <= 0 {
		return nil, errors.New("need at least one client count and a positive -duration")
	}
	schema := services.Name("nolock_bench")
	dsn, err := searchPathDSN(cfg.postgres, schema)
	if err != nil {
		return nil, err
	}
	poolCfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	poolCfg.MaxConns = int32(max(slicesMax(cfg.clients), 4) + 8) // every client a connection, plus the combiners'
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	fmt.Fprintf(progressOut, "nolock bench: schema %s, clients %v, %v per run\n", schema, cfg.clients, cfg.duration)

	env := &benchEnv{dsn: dsn, pool: pool, obs: cfg.obs}
	if cfg.redis != "" {
		env.redis = redis.NewClient(&redis.Options{Addr: cfg.redis, PoolSize: slicesMax(cfg.clients) + 8})
		defer env.redis.Close()
		if err := env.redis.Ping(ctx).Err(); err != nil {
			return nil, fmt.Errorf("redis %s: %w", cfg.redis, err)
		}
	} else {
		fmt.Fprintln(progressOut, "nolock bench: no -redis address: skipping the Redis lock scenario")
	}
	if err := benchSchema(ctx, pool); err != nil {
		return nil, err
	}

	res := &benchResult{clients: cfg.clients, measures: map[string][]measure{}}
	var scs []benchScenario
	for _, sc := range selectScenarios(cfg.run) {
		if sc.redis && env.redis == nil {
			continue
		}
		scs = append(scs, sc)
		res.scenarios = append(res.scenarios, sc.name)
	}
	total, n := len(scs)*len(cfg.clients), 0
	// Every scenario at one client count, then the next count: the ratios
	// compare runs close in time.
	for _, clients := range cfg.clients {
		for _, sc := range scs {
			n++
			m, err := benchOne(ctx, env, sc, clients, cfg.duration)
			if err != nil {
				return nil, fmt.Errorf("%s, %d clients: %w", sc.name, clients, err)
			}
			fmt.Fprintf(progressOut, "  [%*d/%d] %-30s clients=%-3d %9.0f ops/s  p99 %v\n", len(strconv.Itoa(total)), n, total, sc.name, clients, m.run.Rate, m.run.P99.Round(10*time.Microsecond))
			res.measures[sc.name] = append(res.measures[sc.name], m)
		}
	}
	printBenchTable(out, res)
	printProcessRatio(out, res)
	if cfg.svg != "" {
		if err := writeSVG(cfg.svg, res); err != nil {
			return nil, err
		}
		fmt.Fprintf(progressOut, "nolock bench: plot written to %s\n", cfg.svg)
	}
	return res, nil
}

// selectScenarios returns the baseline (the first scenario: every ratio
// is against it) and the scenarios whose name re matches; nil re selects
// every scenario.
func selectScenarios(re *regexp.Regexp) []benchScenario {
	if re == nil {
		return benchScenarios
	}
	out := benchScenarios[:1:1]
	for _, sc := range benchScenarios[1:] {
		if re.MatchString(sc.name) {
			out = append(out, sc)
		}
	}
	return out
}

// benchScenarioNames lists every scenario's name, for a usage error.
func benchScenarioNames() string {
	names := make([]string, len(benchScenarios))
	for i, sc := range benchScenarios {
		names[i] = strconv.Quote(sc.name)
	}
	return strings.Join(names, ", ")
}

// benchSchema creates the baselines' table and the packages' tables.
func benchSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE plain (key text PRIMARY KEY, qty bigint NOT NULL CHECK (qty >= 0)) WITH (fillfactor = 70)`); err != nil {
		return err
	}
	stock, err := conditional.NewStock(pool)
	if err != nil {
		return err
	}
	defer stock.Close()
	accounts, err := conditional.NewAccounts(pool)
	if err != nil {
		return err
	}
	defer accounts.Close()
	keys, err := idempotency.New(pool)
	if err != nil {
		return err
	}
	backend, err := pgcas.NewBackend(pool)
	if err != nil {
		return err
	}
	for _, create := range []func(context.Context) error{stock.CreateSchema, accounts.CreateSchema, keys.CreateSchema, backend.CreateSchema} {
		if err := create(ctx); err != nil {
			return err
		}
	}
	return nil
}

// benchOne prepares sc for clients, runs it for d and checks its effect.
func benchOne(ctx context.Context, env *benchEnv, sc benchScenario, clients int, d time.Duration) (measure, error) {
	tr, err := sc.setup(ctx, env)
	if tr.done != nil {
		defer tr.done()
	}
	if err != nil {
		return measure{}, err
	}
	var run services.Run
	if tr.run != nil {
		run, err = tr.run(ctx, clients, d)
	} else {
		run, err = services.RunClients(ctx, clients, 0, d, tr.op)
	}
	if err != nil {
		return measure{}, err
	}
	m := measure{clients: clients, run: run}
	if m.effect, err = tr.effect(ctx); err != nil {
		return measure{}, err
	}
	if m.effect != run.Ops {
		return measure{}, fmt.Errorf("invariant broken: %d operations succeeded but the store shows %d", run.Ops, m.effect)
	}
	return m, nil
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// printBenchTable prints scenario × clients → ops/s and the ratio against
// the FOR UPDATE transaction (the first scenario) at the same count.
func printBenchTable(out io.Writer, res *benchResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "scenario")
	for _, c := range res.clients {
		fmt.Fprintf(tw, "\tclients=%d\tx for update", c)
	}
	fmt.Fprintln(tw)
	base := res.measures[res.scenarios[0]]
	for _, name := range res.scenarios {
		fmt.Fprint(tw, name)
		for i, m := range res.measures[name] {
			fmt.Fprintf(tw, "\t%9.0f ops/s\t%6.2f", m.run.Rate, m.run.Rate/base[i].run.Rate)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
