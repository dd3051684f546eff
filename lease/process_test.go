package lease_test

// Tests with a holder in its own process (testenv.StartChild), paused
// (SIGSTOP) like a frozen server, and with the database server crashing
// under a held lease.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// Environment of the child processes.
const (
	envDSN   = "NOLOCK_LEASE_DSN"
	envLease = "NOLOCK_LEASE_MS"
	envKeys  = "NOLOCK_LEASE_KEYS" // comma-separated lock keys
)

// childWait bounds how long a test waits for a child's line: the child is
// a race-instrumented test binary starting on a busy machine.
var childWait = testenv.Scale(30 * time.Second)

// TestChildFencedWriter is a child's body: for each key of
// NOLOCK_LEASE_KEYS it takes the lock and writes that key's manifest row
// through conditional.Fenced with its token, every quarter lease, never
// looking at Lost (the worst case: a pause between a check and a write).
// A write falls due at once when the process wakes from a longer pause.
// It prints "acquired <key> <token>", "wrote <key>", "refused <key>" and
// "lost <key> <cause>". A stale write that landed shows in the row: the
// parent checks that every row keeps its data.
func TestChildFencedWriter(t *testing.T) {
	testenv.ChildOnly(t)
	ms, _ := strconv.Atoi(os.Getenv(envLease))
	lease := time.Duration(ms) * time.Millisecond
	pool := testenv.Pool(t, os.Getenv(envDSN), 8)
	c := newClient(t, pool, leaseOpt(lease), ownerOpt("child"))
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, key := range strings.Split(os.Getenv(envKeys), ",") {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := zombieWriter(c, pool, f, key, lease); err != nil {
				fmt.Printf("error %s: %v\n", key, err)
			}
		}()
	}
	wg.Wait()
}

func leaseOpt(d time.Duration) lease.Option { return lease.WithLease(d) }
func ownerOpt(s string) lease.Option        { return lease.WithOwner(s) }

func zombieWriter(c *lease.Client, pool *pgxpool.Pool, f *conditional.Fenced, key string, d time.Duration) error {
	ctx := context.Background()
	actx, cancel := context.WithTimeout(ctx, childWait)
	l, err := c.Acquire(actx, key)
	cancel()
	if err != nil {
		return err
	}
	fmt.Printf("acquired %s %d\n", key, l.Token())
	for n := 0; ; n++ {
		next := time.Now().Add(d / 4)
		err := f.Update(ctx, pool, key, l.Token(), map[string]any{"files": fmt.Sprintf("child-%d", n)})
		if errors.Is(err, conditional.ErrFenced) {
			fmt.Printf("refused %s\n", key)
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
	cause := "not-lost"
	select {
	case <-l.Lost():
		var le *lease.LostError
		if errors.As(l.Err(), &le) {
			cause = strings.ReplaceAll(le.Cause.String(), " ", "-")
		}
	case <-time.After(2 * d):
	}
	fmt.Printf("lost %s %s\n", key, cause)
	return nil
}

// Holders paused (SIGSTOP) past their lease cannot write to a fenced
// resource when they wake. Per trial: a child holds a key and writes its
// manifest row with the token; the child is paused; the parent takes the
// key (the database lets it once the lease has run out) with a higher
// token and writes the row; the child resumes and writes at once with its
// old token. That write must be refused, the row must keep the parent's
// data, and the child must see Lost. Under NOLOCK_STRESS=1, 1,000 trials.
func TestPausedHolderFenced(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t, 16)
	if _, err := pool.Exec(context.Background(),
		`CREATE TABLE manifest (name text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, pool)
	trials := testenv.Trials(8, 1000)
	var stale, lost, done int
	for round := 0; done < trials; round++ {
		keys := make([]string, min(100, trials-done))
		for i := range keys {
			keys[i] = fmt.Sprintf("r%d-k%d", round, i)
		}
		s, l := pauseRound(t, c, pool, testenv.PostgresDSNFor(t, schema), keys)
		stale, lost, done = stale+s, lost+l, done+len(keys)
	}
	testenv.Figures(t, "lease SIGSTOP zombie", "%d trials, %d stale writes accepted, %d lost observed", done, stale, lost)
	if stale != 0 || lost != done {
		t.Fatalf("%d trials: %d stale writes accepted, %d losses observed; want 0 and all", done, stale, lost)
	}
}

// pauseRound runs one trial per key in one child and returns the stale
// writes accepted (rows that lost the new holder's data) and the losses
// the child observed.
func pauseRound(t *testing.T, c *lease.Client, pool *pgxpool.Pool, dsn string, keys []string) (stale, lost int) {
	t.Helper()
	ctx := context.Background()
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO manifest (name, files) SELECT k, 'none' FROM unnest($1::text[]) k`, keys); err != nil {
		t.Fatal(err)
	}
	child := testenv.StartChild(t, "TestChildFencedWriter", envDSN+"="+dsn,
		envLease+"="+strconv.Itoa(int(testLease/time.Millisecond)), envKeys+"="+strings.Join(keys, ","))
	old := map[string]int64{}
	for wrote := 0; wrote < len(keys); {
		w := strings.Fields(child.WaitFor("", childWait))
		switch {
		case len(w) == 3 && w[0] == "acquired":
			old[w[1]], _ = strconv.ParseInt(w[2], 10, 64)
		case len(w) == 2 && w[0] == "wrote":
			wrote++
		case len(w) > 0 && w[0] == "error":
			t.Fatalf("child: %v", w)
		}
	}
	child.Pause()
	locks := make([]*lease.Lock, len(keys))
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
			locks[i] = l
			if l.Token() <= old[key] {
				t.Errorf("%s taken with token %d; the paused holder's is %d", key, l.Token(), old[key])
			}
			if err := f.Update(ctx, pool, key, l.Token(), map[string]any{"files": "new-holder"}); err != nil {
				t.Errorf("new holder's write to %s: %v", key, err)
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
	child.Resume()
	for seen := 0; seen < len(keys); {
		w := strings.Fields(child.WaitFor("", childWait))
		switch {
		case len(w) == 3 && w[0] == "lost":
			seen++
			if w[2] != "not-lost" {
				lost++
			}
		case len(w) > 0 && w[0] == "error":
			t.Fatalf("child: %v", w)
		}
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM manifest WHERE name = ANY($1) AND files <> 'new-holder'`, keys).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	return wrong, lost
}

// PostgreSQL crashes under a held lease and restarts. Whatever the
// timing, there are never two holders by their own belief, and tokens
// only grow: the holder either keeps renewing after the restart (then a
// rival is refused) or has learnt of its loss (then a rival takes the
// lock with a higher token).
func TestServerRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 8)
	d := testenv.Scale(2 * time.Second)
	a := newClient(t, pool, lease.WithLease(d))
	b := newClient(t, pool, lease.WithLease(d))
	for _, down := range []time.Duration{d / 8, 3 * d / 2} {
		key := "k-" + down.String()
		l := mustAcquire(t, a, key)
		srv.CrashFor(down)
		testenv.Until(t, "the server answers", func() (bool, error) { return pool.Ping(context.Background()) == nil, nil })
		nl, err := b.TryAcquire(context.Background(), key)
		switch {
		case err == nil:
			if !closed(l.Lost()) || nl.Token() <= l.Token() {
				t.Fatalf("down %v: rival took token %d while the holder (token %d) lost=%v", down, nl.Token(), l.Token(), closed(l.Lost()))
			}
			t.Logf("down %v: holder lost (%v); rival took token %d", down, l.Err(), nl.Token())
			nl.Close()
		case errors.Is(err, lease.ErrNotAcquired):
			t.Logf("down %v: holder kept the lock (err %v)", down, l.Err())
		default:
			t.Fatalf("down %v: TryAcquire: %v", down, err)
		}
		l.Close()
	}
}
