package main

// The scene end to end, a chain of acquisitions whose tokens must rise,
// and holders in their own process paused with SIGSTOP past their lease.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// childWait bounds how long a test waits for a child's line or a lock: the
// child is a race-instrumented test binary starting on a busy machine.
var childWait = testenv.Scale(30 * time.Second)

// The example runs end to end on the test services and its own checks
// (which return an error when an invariant breaks) pass, on PostgreSQL
// directly and behind PgBouncer (see testenv.ExampleDeployments).
func TestExample(t *testing.T) {
	endpoints := testenv.Etcd(t)
	for _, d := range testenv.ExampleDeployments() {
		t.Run(d.Name, func(t *testing.T) {
			if err := run(context.Background(), endpoints, d.DSN(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// manifestTable creates the manifest table in a fresh schema with one row
// per name and returns a pool on it, the schema's DSN and the fence.
func manifestTable(t *testing.T, names ...string) (*pgxpool.Pool, string, *conditional.Fenced) {
	t.Helper()
	pool, schema := testenv.PostgresSchema(t, 16)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE manifest (name text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO manifest (name, files) SELECT n, 'none' FROM unnest($1::text[]) n`, names); err != nil {
		t.Fatal(err)
	}
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	return pool, testenv.PostgresDSNFor(t, schema), f
}

// testWorker is newWorker for a test: closed when the test ends.
func testWorker(t *testing.T, name string, ttl int, prefix string) *worker {
	t.Helper()
	w, err := newWorker(name, testenv.Etcd(t), ttl, prefix)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(w.close)
	return w
}

// Workers contending for one etcd lock get tokens that strictly rise in
// the order the lock was held, every holder's fenced write is accepted,
// and afterwards a write with an earlier holder's token is refused while
// the same write without the fence would land (so the check can fail).
// Sessions outlive the test (a long TTL), so the order in which holders
// record their tokens is the order in which etcd granted the lock.
func TestTokensRise(t *testing.T) {
	testenv.Etcd(t) // skip or fail before any setup
	const workers = 3
	n := testenv.Trials(24, 600)
	pool, _, f := manifestTable(t, "events")
	ctx := context.Background()
	prefix := testenv.Name("/nolock/etcdfence/rise")
	ttl := int(testenv.Scale(30*time.Second) / time.Second)

	var mu sync.Mutex
	var tokens []int64
	var holders []string
	var wg sync.WaitGroup
	for i := range workers {
		w := testWorker(t, fmt.Sprintf("w%d", i), ttl, prefix)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lctx, cancel := context.WithTimeout(ctx, childWait)
				err := w.mu.Lock(lctx)
				cancel()
				if err != nil {
					t.Errorf("%s: lock: %v", w.name, err)
					return
				}
				tok, err := token(ctx, w.cli, w.mu)
				if err != nil {
					t.Errorf("%s: token: %v", w.name, err)
					return
				}
				mu.Lock()
				done := len(tokens) >= n
				if !done {
					tokens = append(tokens, tok)
					holders = append(holders, w.name)
				}
				mu.Unlock()
				if !done {
					if err := f.Update(ctx, pool, "events", tok, map[string]any{"files": w.name}); err != nil {
						t.Errorf("%s: fenced write with token %d: %v", w.name, tok, err)
					}
				}
				if err := w.mu.Unlock(ctx); err != nil {
					t.Errorf("%s: unlock: %v", w.name, err)
					return
				}
				if done {
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if len(tokens) < 20 {
		t.Fatalf("%d acquisitions, want at least 20", len(tokens))
	}
	rises := 0
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("acquisition %d (%s) got token %d, not above acquisition %d's %d", i, holders[i], tokens[i], i-1, tokens[i-1])
			continue
		}
		rises++
	}
	last := tokens[len(tokens)-1]
	if files, fence := readRow(t, pool, "events"); files != holders[len(holders)-1] || fence != last {
		t.Errorf("row holds %q with fence %d, want the last holder's %q with %d", files, fence, holders[len(holders)-1], last)
	}

	// A write with the first holder's token, after everyone else's.
	stale := tokens[0]
	if err := f.Update(ctx, pool, "events", stale, map[string]any{"files": "stale"}); !errors.Is(err, conditional.ErrFenced) {
		t.Errorf("write with the first token %d after the last %d: %v, want ErrFenced", stale, last, err)
	}
	if n := unfencedRows(t, pool, "events", stale); n != 1 {
		t.Errorf("the same write without the fence changed %d rows, want 1 (the test could not fail)", n)
	}
	if files, fence := readRow(t, pool, "events"); files != holders[len(holders)-1] || fence != last {
		t.Errorf("after the stale write the row holds %q with fence %d, want %q with %d", files, fence, holders[len(holders)-1], last)
	}
	testenv.Figures(t, "etcd lock tokens", "%d acquisitions by %d workers, %d rises of %d steps, tokens %d..%d", len(tokens), workers, rises, len(tokens)-1, tokens[0], last)
}

// readRow returns the manifest row's files and fence.
func readRow(t *testing.T, pool *pgxpool.Pool, name string) (files string, fence int64) {
	t.Helper()
	if err := pool.QueryRow(context.Background(), `SELECT files, fence FROM manifest WHERE name = $1`, name).Scan(&files, &fence); err != nil {
		t.Fatal(err)
	}
	return files, fence
}

// unfencedRows runs a stale holder's write without the fence condition in
// a transaction it rolls back, and returns how many rows it changed.
func unfencedRows(t *testing.T, pool *pgxpool.Pool, name string, token int64) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE manifest SET files = 'stale', fence = $1 WHERE name = $2`, token, name)
	if err != nil {
		t.Fatal(err)
	}
	return tag.RowsAffected()
}

// Environment of the child processes.
const (
	envDSN      = "NOLOCK_ETCDFENCE_DSN"
	envPrefixes = "NOLOCK_ETCDFENCE_PREFIXES" // lock prefix=manifest row, comma-separated
	envResumed  = "NOLOCK_ETCDFENCE_RESUMED"  // a file the parent creates before resuming the child
)

// TestChildHolder is a child's body: with one session (one lease of
// sceneTTL seconds, as one process has), for each lock prefix of
// NOLOCK_ETCDFENCE_PREFIXES it takes etcd's lock and writes that lock's
// manifest row through conditional.Fenced with its token, every quarter
// TTL, never looking at its session (the worst case: a pause between a
// check and a write). A write falls due at once when the process wakes
// from a longer pause. It prints "acquired <name> <token>", "wrote
// <name>", then "refused <name>" or, if its write after the pause landed,
// "accepted <name>", and "lost <name> <yes|no>" (whether the session
// reported its lease gone).
func TestChildHolder(t *testing.T) {
	testenv.ChildOnly(t)
	pool := testenv.Pool(t, os.Getenv(envDSN), 8)
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	w := testWorker(t, "child", sceneTTL, "")
	var wg sync.WaitGroup
	for _, p := range strings.Split(os.Getenv(envPrefixes), ",") {
		prefix, name, _ := strings.Cut(p, "=")
		m := concurrency.NewMutex(w.sess, prefix)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := zombieWriter(w, m, pool, f, name); err != nil {
				fmt.Printf("error %s: %v\n", name, err)
			}
		}()
	}
	wg.Wait()
}

func zombieWriter(w *worker, m *concurrency.Mutex, pool *pgxpool.Pool, f *conditional.Fenced, name string) error {
	ctx := context.Background()
	lctx, cancel := context.WithTimeout(ctx, childWait)
	err := m.Lock(lctx)
	cancel()
	if err != nil {
		return err
	}
	tok, err := token(ctx, w.cli, m)
	if err != nil {
		return err
	}
	fmt.Printf("acquired %s %d\n", name, tok)
	every := sceneTTL * time.Second / 4
	for n := 0; ; n++ {
		next := time.Now().Add(every)
		// Test bookkeeping, not a lock check: the parent creates the
		// marker before resuming this process, so a write started after
		// seeing it is the write after the pause.
		_, statErr := os.Stat(os.Getenv(envResumed))
		resumed := statErr == nil
		err := f.Update(ctx, pool, name, tok, map[string]any{"files": fmt.Sprintf("child-%d", n)})
		if errors.Is(err, conditional.ErrFenced) {
			fmt.Printf("refused %s\n", name)
			break
		}
		if err != nil {
			return err
		}
		if resumed {
			fmt.Printf("accepted %s\n", name) // the stale write landed
			break
		}
		if n == 0 {
			fmt.Printf("wrote %s\n", name)
		}
		time.Sleep(time.Until(next))
	}
	lost := "no"
	select {
	case <-w.sess.Done():
		lost = "yes"
	case <-time.After(childWait):
	}
	fmt.Printf("lost %s %s\n", name, lost)
	return nil
}

// Holders paused (SIGSTOP) past their session's TTL cannot write to a
// fenced resource when they wake. Per trial: a child process holds one of
// etcd's locks and writes its manifest row with the token; the child is
// paused; etcd lets its lease expire and the parent gets the lock with a
// higher token and writes the row; the child resumes and writes at once
// with its old token. That write must be refused, the row must keep the
// parent's data, and the child's session must report its lease gone.
// Under NOLOCK_STRESS=1, 200 trials.
func TestPausedHolderFenced(t *testing.T) {
	testenv.Etcd(t) // skip or fail before any setup
	trials := testenv.Trials(8, 200)
	var stale, refused, lost, done int
	for round := 0; done < trials; round++ {
		k := min(50, trials-done)
		s, r, l := pauseRound(t, round, k)
		stale, refused, lost, done = stale+s, refused+r, lost+l, done+k
	}
	testenv.Figures(t, "etcd lock SIGSTOP zombie", "%d trials, %d stale writes accepted, %d refused, %d losses observed", done, stale, refused, lost)
	if stale != 0 || refused != done || lost != done {
		t.Fatalf("%d trials: %d stale writes accepted, %d refused, %d losses observed; want 0, all, all", done, stale, refused, lost)
	}
}

// pauseRound runs k trials in one child (one lock each) and returns the
// stale writes accepted (rows that lost the new holder's data), the
// child's refused writes and the losses the child observed.
func pauseRound(t *testing.T, round, k int) (stale, refused, lost int) {
	t.Helper()
	ctx := context.Background()
	names := make([]string, k)
	prefixes := make([]string, k)
	base := testenv.Name("/nolock/etcdfence/zombie")
	for i := range names {
		names[i] = fmt.Sprintf("r%d-k%d", round, i)
		prefixes[i] = base + "/" + names[i] + "=" + names[i]
	}
	pool, dsn, f := manifestTable(t, names...)
	marker := filepath.Join(t.TempDir(), "resumed")
	child := testenv.StartChild(t, "TestChildHolder", envDSN+"="+dsn, envPrefixes+"="+strings.Join(prefixes, ","), envResumed+"="+marker)
	old := map[string]int64{}
	for wrote := 0; wrote < k; {
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

	// The parent takes every lock once etcd has expired the child's
	// leases, and writes with its own token.
	parent := testWorker(t, "parent", int(testenv.Scale(30*time.Second)/time.Second), "")
	tokens := make([]int64, k)
	var wg sync.WaitGroup
	for i, name := range names {
		m := concurrency.NewMutex(parent.sess, base+"/"+name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			lctx, cancel := context.WithTimeout(ctx, childWait)
			defer cancel()
			if err := m.Lock(lctx); err != nil {
				t.Errorf("take over %s: %v", name, err)
				return
			}
			tok, err := token(ctx, parent.cli, m)
			if err != nil {
				t.Errorf("take over %s: %v", name, err)
				return
			}
			tokens[i] = tok
			if tok <= old[name] {
				t.Errorf("%s taken with token %d; the paused holder's is %d", name, tok, old[name])
			}
			if err := f.Update(ctx, pool, name, tok, map[string]any{"files": "new-holder"}); err != nil {
				t.Errorf("new holder's write to %s: %v", name, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	child.Resume()
	for seen := 0; seen < k; {
		w := strings.Fields(child.WaitFor("", childWait))
		switch {
		case len(w) == 2 && w[0] == "refused":
			refused++
		case len(w) == 3 && w[0] == "lost":
			seen++
			if w[2] == "yes" {
				lost++
			}
		case len(w) > 0 && w[0] == "error":
			t.Errorf("child: %v", w)
			seen++
		}
	}
	if err := child.Wait(); err != nil {
		t.Errorf("child: %v", err)
	}
	rows, err := pool.Query(ctx, `SELECT name, files, fence FROM manifest`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for i, name := range names {
		want[name] = tokens[i]
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		name, files string
		fence       int64
	}, error) {
		var v struct {
			name, files string
			fence       int64
		}
		err := r.Scan(&v.name, &v.files, &v.fence)
		return v, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r.files != "new-holder" || r.fence != want[r.name] {
			stale++
			t.Errorf("%s holds %q with fence %d, want the new holder's with %d", r.name, r.files, r.fence, want[r.name])
		}
	}
	return stale, refused, lost
}
