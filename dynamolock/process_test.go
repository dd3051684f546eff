package dynamolock_test

// Tests with participants in their own processes (testenv.StartChild): a
// holder that is killed (SIGKILL) or paused (SIGSTOP) like a crashed or
// frozen server, and workers in several processes contending for one lock.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// Environment of the child processes.
const (
	envTable  = "NOLOCK_DL_TABLE"
	envDSN    = "NOLOCK_DL_DSN"
	envRounds = "NOLOCK_DL_ROUNDS"
	envLease  = "NOLOCK_DL_LEASE_MS"
	envKeys   = "NOLOCK_DL_KEYS" // comma-separated lock keys
)

// childWait bounds how long a test waits for a child's line: the child
// is a race-instrumented test binary starting on a busy machine.
var childWait = testenv.Scale(30 * time.Second)

func envInt(t *testing.T, name string) int {
	t.Helper()
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

// TestChildHolder is a child's body: it takes the lock "k" with the lease
// NOLOCK_DL_LEASE_MS and holds it, heartbeating, until it is killed.
func TestChildHolder(t *testing.T) {
	testenv.ChildOnly(t)
	lease := time.Duration(envInt(t, envLease)) * time.Millisecond
	c := newClient(t, testenv.DynamoDB(t), os.Getenv(envTable), dynamolock.WithLease(lease), dynamolock.WithOwner("child"))
	l := mustAcquire(t, c, "k")
	fmt.Printf("acquired token=%d\n", l.Token())
	<-l.Lost()
	fmt.Printf("lost: %v\n", l.Err())
	select {}
}

// A holder's process is killed: while it lived, its heartbeats kept a
// prober out for more than a lease; once dead, a waiter (whose own lease
// setting is ten times longer, so only the lease stored on the item can
// explain the result) takes the lock over after one lease of its own
// elapsed time, and not before.
func TestHolderCrashTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	lease := testLease
	child := testenv.StartChild(t, "TestChildHolder", envTable+"="+table, envLease+"="+strconv.Itoa(int(lease/time.Millisecond)))
	line := child.WaitFor("acquired", childWait)
	token, _ := strconv.ParseInt(strings.TrimPrefix(line, "acquired token="), 10, 64)

	// The prober and the waiter are separate clients: the prober's
	// sightings from before the crash would (rightly) shorten the wait.
	prober := newClient(t, api, table)
	waiter := newClient(t, api, table, dynamolock.WithLease(10*lease))
	for start := time.Now(); time.Since(start) < lease+lease/4; time.Sleep(testPoll) { // a caller retrying TryAcquire
		if l, err := prober.TryAcquire(ctx, "k"); !errors.Is(err, dynamolock.ErrNotAcquired) {
			if l != nil {
				l.Close()
			}
			t.Fatalf("TryAcquire while the holder lives: %v", err)
		}
	}
	child.Kill()
	child.Wait()
	start := time.Now()
	l := mustAcquire(t, waiter, "k")
	took := time.Since(start)
	defer l.Close()
	// The waiter's first sighting is after start, so it waits a whole
	// lease at least; a busy machine may delay the takeover, never advance
	// it. (How soon after the lease it comes is BenchmarkLock/takeover's.)
	if took < lease {
		t.Fatalf("taken over %v after the crash; want the lease (%v) at least", took, lease)
	}
	if l.Token() != token+1 {
		t.Fatalf("token %d after the holder's %d", l.Token(), token)
	}
	t.Logf("holder (token %d) killed; waiter took over after %v with token %d", token, took.Round(time.Millisecond), l.Token())
}

// fencedSchema creates the protected resource in PostgreSQL: manifest rows
// written through conditional.Fenced, and the same data in rows written
// without a fence, to show what fencing prevents.
func fencedSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
CREATE TABLE manifest (name text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0);
CREATE TABLE unfenced (name text PRIMARY KEY, files text NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
}

// TestChildFencedWriter is a child's body: for each key of NOLOCK_DL_KEYS
// it takes the lock and writes that key's manifest row with its token,
// every quarter lease, never looking at Lost (the worst case: a pause
// between a check and a write). A write falls due at once when the
// process wakes from a pause longer than that. When a write is refused it
// writes the unfenced row once, waits for Lost, and reports.
func TestChildFencedWriter(t *testing.T) {
	testenv.ChildOnly(t)
	ctx := context.Background()
	lease := time.Duration(envInt(t, envLease)) * time.Millisecond
	c := newClient(t, testenv.DynamoDB(t), os.Getenv(envTable), dynamolock.WithLease(lease), dynamolock.WithOwner("child"))
	pool := testenv.Pool(t, os.Getenv(envDSN), 8)
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, key := range strings.Split(os.Getenv(envKeys), ",") {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := zombieWriter(ctx, c, pool, f, key, lease); err != nil {
				fmt.Printf("error %s: %v\n", key, err)
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("done")
}

// zombieWriter is one key of TestChildFencedWriter. It prints "acquired
// <key> <token>", "wrote <key>" after its first write, then "refused <key>
// unfenced=<error>" and "lost <key> <cause>" (the cause of its loss, or
// "not lost" if Lost stayed open for two leases after the refusal).
func zombieWriter(ctx context.Context, c *dynamolock.Client, pool *pgxpool.Pool, f *conditional.Fenced, key string, lease time.Duration) error {
	actx, cancel := context.WithTimeout(ctx, childWait)
	l, err := c.Acquire(actx, key)
	cancel()
	if err != nil {
		return err
	}
	fmt.Printf("acquired %s %d\n", key, l.Token())
	for n := 0; ; n++ {
		next := time.Now().Add(lease / 4)
		files := fmt.Sprintf("child-%d", n)
		err := f.Update(ctx, pool, key, l.Token(), map[string]any{"files": files})
		if errors.Is(err, conditional.ErrFenced) {
			_, err := pool.Exec(ctx, "UPDATE unfenced SET files = $1 WHERE name = $2", files, key)
			fmt.Printf("refused %s unfenced=%v\n", key, err)
			break
		}
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Printf("wrote %s\n", key)
		}
		time.Sleep(time.Until(next))
	}
	cause := "not lost"
	select {
	case <-l.Lost():
		var lost *dynamolock.LostError
		if errors.As(l.Err(), &lost) {
			cause = lost.Cause.String()
		}
	case <-time.After(2 * lease):
	}
	fmt.Printf("lost %s %s\n", key, cause)
	return nil
}

// Holders paused (SIGSTOP) past their lease cannot write to a fenced
// resource when they wake. In each trial a child holds a lock and writes
// its manifest row with the token; the child is paused; a new holder takes
// the lock over with a higher token and writes the row first; the child
// resumes and writes at once with its old token. That write must be
// refused, and the child must learn of its loss through Lost. The same
// write without the fence lands over the new holder's data: the failure
// fencing exists to prevent, shown not to be hypothetical, and proof that
// each trial's stale write really came after the new holder's. A child
// serves many keys, one trial each; under NOLOCK_STRESS=1 the rounds run
// 1,000 trials.
func TestPausedHolderFenced(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	pool, schema := testenv.PostgresSchema(t, 8)
	fencedSchema(t, pool)
	c := newClient(t, api, table, dynamolock.WithPoll(testLease/4))
	trials := testenv.Trials(16, 1000)
	var sum zombieCounts
	for round := 0; sum.trials < trials; round++ {
		keys := make([]string, min(100, trials-sum.trials))
		for i := range keys {
			keys[i] = fmt.Sprintf("r%d-k%d", round, i)
		}
		sum.add(pauseRound(t, c, pool, testenv.PostgresDSNFor(t, schema), table, keys))
	}
	testenv.Figures(t, "dynamolock SIGSTOP zombie", "%d trials, %d stale writes accepted, %d lost observed",
		sum.trials, sum.stale, sum.lost)
	t.Logf("control: %d of %d stale unfenced writes landed over the new holder's; taken over %v to %v after the pause",
		sum.landed, sum.trials, sum.minPause.Round(time.Millisecond), sum.maxPause.Round(time.Millisecond))
	if sum.stale != 0 || sum.lost != sum.trials || sum.landed != sum.trials {
		t.Fatalf("%d trials: %d stale writes accepted, %d losses observed, %d unfenced stale writes landed; want 0, all, all",
			sum.trials, sum.stale, sum.lost, sum.landed)
	}
}

// zombieCounts sums the outcomes of SIGSTOP zombie trials.
type zombieCounts struct {
	trials, stale, lost, landed int
	minPause, maxPause          time.Duration
}

func (z *zombieCounts) add(r zombieCounts) {
	if z.trials == 0 || r.minPause < z.minPause {
		z.minPause = r.minPause
	}
	z.maxPause = max(z.maxPause, r.maxPause)
	z.trials += r.trials
	z.stale += r.stale
	z.lost += r.lost
	z.landed += r.landed
}

// pauseRound runs one trial per key in one child (TestChildFencedWriter):
// every key is held and written by the child, the child is paused, c
// takes every key over and writes it, and the child is resumed.
func pauseRound(t *testing.T, c *dynamolock.Client, pool *pgxpool.Pool, dsn, table string, keys []string) zombieCounts {
	t.Helper()
	ctx := context.Background()
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO manifest (name, files) SELECT k, 'none' FROM unnest($1::text[]) k`, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO unfenced (name, files) SELECT k, 'none' FROM unnest($1::text[]) k`, keys); err != nil {
		t.Fatal(err)
	}
	child := testenv.StartChild(t, "TestChildFencedWriter", envTable+"="+table, envDSN+"="+dsn,
		envLease+"="+strconv.Itoa(int(testLease/time.Millisecond)), envKeys+"="+strings.Join(keys, ","))
	old := map[string]int64{}    // the child's tokens
	refused := map[string]bool{} // the child's fenced write was refused
	lost := map[string]string{}  // the cause of its loss the child saw
	read := func(line string) error {
		w := strings.Fields(line)
		switch {
		case len(w) == 3 && w[0] == "acquired":
			old[w[1]], _ = strconv.ParseInt(w[2], 10, 64)
		case len(w) >= 2 && w[0] == "refused":
			refused[w[1]] = true
		case len(w) >= 3 && w[0] == "lost":
			lost[w[1]] = strings.Join(w[2:], " ")
		case len(w) >= 1 && w[0] == "error":
			return errors.New(line)
		}
		return nil
	}
	for wrote := 0; wrote < len(keys); {
		line := child.WaitFor("", childWait)
		if err := read(line); err != nil {
			t.Fatalf("child: %v", err)
		}
		if strings.HasPrefix(line, "wrote ") {
			wrote++
		}
	}

	child.Pause()
	paused := time.Now()
	locks := make([]*dynamolock.Lock, len(keys))
	took := make([]time.Duration, len(keys)) // from the pause to the takeover
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, childWait)
			defer cancel()
			l, err := c.Acquire(actx, key)
			if err != nil {
				t.Errorf("take over %s: %v", key, err)
				return
			}
			locks[i], took[i] = l, time.Since(paused)
			if err := f.Update(ctx, pool, key, l.Token(), map[string]any{"files": "new-holder"}); err != nil {
				t.Errorf("new holder's fenced write to %s: %v", key, err)
			}
			if _, err := pool.Exec(ctx, "UPDATE unfenced SET files = 'new-holder' WHERE name = $1", key); err != nil {
				t.Errorf("new holder's unfenced write to %s: %v", key, err)
			}
		}()
	}
	wg.Wait()
	for _, l := range locks {
		if l != nil {
			defer l.Close()
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	r := zombieCounts{trials: len(keys), minPause: slices.Min(took), maxPause: slices.Max(took)}
	tokens := map[string]int64{}
	for i, l := range locks {
		if tokens[keys[i]] = l.Token(); l.Token() <= old[keys[i]] {
			t.Fatalf("%s taken over with token %d; the paused holder's is %d", keys[i], l.Token(), old[keys[i]])
		}
	}
	child.Resume()

	// Every woken writer is refused and then learns of its loss, or its
	// stale write landed (then it goes on writing and never reports).
	stale := map[string]bool{}
	testenv.Until(t, "every paused writer woke and was answered", func() (bool, error) {
		for line, ok := child.TryLine(); ok; line, ok = child.TryLine() {
			if err := read(line); err != nil {
				return false, err
			}
		}
		rows, err := pool.Query(ctx, "SELECT name FROM manifest WHERE name = ANY($1) AND files <> 'new-holder'", keys)
		if err != nil {
			return false, err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return false, err
		}
		for _, n := range names {
			stale[n] = true
		}
		for _, k := range keys {
			if !stale[k] && (!refused[k] || lost[k] == "") {
				return false, nil
			}
		}
		return true, nil
	})
	if len(stale) > 0 {
		child.Kill()
	}
	if err := child.Wait(); len(stale) == 0 && err != nil {
		t.Fatalf("child: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT m.name, m.files, m.fence, u.files FROM manifest m JOIN unfenced u USING (name) WHERE name = ANY($1)`, keys)
	if err != nil {
		t.Fatal(err)
	}
	var name, files, unfenced string
	var fence int64
	_, err = pgx.ForEachRow(rows, []any{&name, &files, &fence, &unfenced}, func() error {
		if files != "new-holder" || fence != tokens[name] {
			r.stale++
			t.Errorf("%s: manifest %q at fence %d; want the new holder's write at %d", name, files, fence, tokens[name])
		}
		if strings.HasPrefix(unfenced, "child-") {
			r.landed++
		}
		if lost[name] == dynamolock.Expired.String() || lost[name] == dynamolock.TakenOver.String() {
			r.lost++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// exclusionSchema creates the shared counter of the cross-process test.
func exclusionSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
CREATE TABLE excl (id int PRIMARY KEY, inside int NOT NULL, entries int NOT NULL, overlapped int NOT NULL,
                   regressions int NOT NULL, lost int NOT NULL, last_token bigint NOT NULL);
INSERT INTO excl VALUES (1, 0, 0, 0, 0, 0, 0)`)
	if err != nil {
		t.Fatal(err)
	}
}

// exclusionWorkers runs workers goroutines, each with its own Client, each
// taking the lock "hot" rounds times. Inside, one statement counts the
// entry, an overlap if someone else is inside, and a regression if the
// token is not above every token seen before.
func exclusionWorkers(t *testing.T, api dynamolock.DynamoDBAPI, table string, pool *pgxpool.Pool, workers, rounds int) {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		c := newClient(t, api, table)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
				l, err := c.Acquire(ctx, "hot")
				if err != nil {
					cancel()
					t.Error(err)
					return
				}
				_, err = pool.Exec(ctx, `UPDATE excl SET inside = inside + 1, entries = entries + 1,
  overlapped = overlapped + (inside > 0)::int, regressions = regressions + (last_token >= $1)::int,
  last_token = greatest(last_token, $1) WHERE id = 1`, l.Token())
				lost := 0
				if err == nil {
					time.Sleep(time.Duration(1+r%3) * time.Millisecond)
					if closed(l.Lost()) {
						lost = 1
					}
					_, err = pool.Exec(ctx, `UPDATE excl SET inside = inside - 1, lost = lost + $1 WHERE id = 1`, lost)
				}
				rerr := l.Release(ctx)
				if errors.Is(rerr, dynamolock.ErrLockLost) {
					// Its lease lapsed on a machine too busy for its
					// heartbeats: counted once as a loss.
					rerr = nil
					if err == nil && lost == 0 {
						_, rerr = pool.Exec(ctx, `UPDATE excl SET lost = lost + 1 WHERE id = 1`)
					}
				}
				if err == nil {
					err = rerr
				}
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestChildExclusion is a child's body: two workers of exclusionWorkers.
func TestChildExclusion(t *testing.T) {
	testenv.ChildOnly(t)
	pool := testenv.Pool(t, os.Getenv(envDSN), 4)
	exclusionWorkers(t, testenv.DynamoDB(t), os.Getenv(envTable), pool, 2, envInt(t, envRounds))
	fmt.Println("done")
}

// Workers in three child processes and in this one contend for one lock:
// never two inside at once (counted in PostgreSQL, which every process
// sees), every entry counted, tokens strictly growing in entry order.
func TestMutualExclusionProcesses(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	pool, schema := testenv.PostgresSchema(t, 8)
	exclusionSchema(t, pool)
	const children, rounds = 3, 8
	var kids []*testenv.Child
	for i := 0; i < children; i++ {
		kids = append(kids, testenv.StartChild(t, "TestChildExclusion", envTable+"="+table,
			envDSN+"="+testenv.PostgresDSNFor(t, schema), envRounds+"="+strconv.Itoa(rounds)))
	}
	exclusionWorkers(t, api, table, pool, 2, rounds)
	for i, k := range kids {
		if err := k.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
	}
	var inside, entries, overlaps, regressions, lost int
	var last int64
	err := pool.QueryRow(context.Background(), "SELECT inside, entries, overlapped, regressions, lost, last_token FROM excl").
		Scan(&inside, &entries, &overlaps, &regressions, &lost, &last)
	if err != nil {
		t.Fatal(err)
	}
	want := (children + 1) * 2 * rounds
	// Only a holder whose lease lapsed (and who learned it) may have
	// overlapped the next, or entered after it (its entry's statement
	// slower than its lease): what a fenced write refuses.
	if overlaps > lost || regressions > lost || inside != 0 || entries != want {
		t.Fatalf("entries %d (want %d), overlaps %d, token regressions %d, inside %d, leases lost %d; want at most one overlap and one regression per lost lease, 0 inside",
			entries, want, overlaps, regressions, inside, lost)
	}
	t.Logf("%d processes × 2 workers: %d entries, %d overlaps, %d leases lost, tokens up to %d", children+1, entries, overlaps, lost, last)
}
