package dynamolock_test

// Tests with participants in their own processes (testenv.StartChild): a
// holder that is killed (SIGKILL) or paused (SIGSTOP) like a crashed or
// frozen server, and workers in several processes contending for one lock.

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
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// Environment of the child processes.
const (
	envTable  = "NOLOCK_DL_TABLE"
	envDSN    = "NOLOCK_DL_DSN"
	envRounds = "NOLOCK_DL_ROUNDS"
	envLease  = "NOLOCK_DL_LEASE_MS"
)

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
// waiter out for two leases; once dead, a waiter (whose own lease setting is
// ten times longer, so only the lease stored on the item can explain the
// result) takes the lock over after one lease of its own elapsed time, and
// not before.
func TestHolderCrashTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	const lease = 600 * time.Millisecond
	child := testenv.StartChild(t, "TestChildHolder", envTable+"="+table, envLease+"="+strconv.Itoa(int(lease/time.Millisecond)))
	line := child.WaitFor("acquired", 60*time.Second)
	token, _ := strconv.ParseInt(strings.TrimPrefix(line, "acquired token="), 10, 64)

	// The prober and the waiter are separate clients: the prober's
	// sightings from before the crash would (rightly) shorten the wait.
	prober := newClient(t, api, table)
	waiter := newClient(t, api, table, dynamolock.WithLease(10*lease), dynamolock.WithPoll(testPoll))
	for start := time.Now(); time.Since(start) < 2*lease; time.Sleep(testPoll) {
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
	if took < lease || took > lease+testPoll+500*time.Millisecond {
		t.Fatalf("taken over %v after the crash; want between the lease (%v) and lease + poll + slack", took, lease)
	}
	if l.Token() != token+1 {
		t.Fatalf("token %d after the holder's %d", l.Token(), token)
	}
	t.Logf("holder (token %d) killed; waiter took over after %v with token %d", token, took.Round(time.Millisecond), l.Token())
}

// fencedSchema creates the protected resource in PostgreSQL: a manifest row
// written through conditional.Fenced, and the same data in a row written
// without a fence, to show what fencing prevents.
func fencedSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
CREATE TABLE manifest (name text PRIMARY KEY, files text NOT NULL, fence bigint NOT NULL DEFAULT 0);
CREATE TABLE unfenced (name text PRIMARY KEY, files text NOT NULL);
INSERT INTO manifest (name, files) VALUES ('segments', 'none');
INSERT INTO unfenced (name, files) VALUES ('segments', 'none')`)
	if err != nil {
		t.Fatal(err)
	}
}

// TestChildFencedWriter is a child's body: it takes the lock "k" and writes
// the manifest with its token every 10 ms, never looking at Lost (the worst
// case: a pause between a check and a write). When a write is refused it
// writes the unfenced row once, reports, and waits to be killed.
func TestChildFencedWriter(t *testing.T) {
	testenv.ChildOnly(t)
	ctx := context.Background()
	lease := time.Duration(envInt(t, envLease)) * time.Millisecond
	c := newClient(t, testenv.DynamoDB(t), os.Getenv(envTable), dynamolock.WithLease(lease), dynamolock.WithOwner("child"))
	pool := testenv.Pool(t, os.Getenv(envDSN), 2)
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, c, "k")
	fmt.Printf("acquired token=%d\n", l.Token())
	state := ""
	for i := 0; ; i++ {
		files := fmt.Sprintf("child-%d", i)
		err := f.Update(ctx, pool, "segments", l.Token(), map[string]any{"files": files})
		s := "fenced ok"
		switch {
		case errors.Is(err, conditional.ErrFenced):
			s = "fenced refused"
		case err != nil:
			s = "fenced error: " + err.Error()
		}
		if s != state {
			fmt.Println(s, files)
			state = s
		}
		if errors.Is(err, conditional.ErrFenced) {
			_, err := pool.Exec(ctx, "UPDATE unfenced SET files = $1 WHERE name = 'segments'", files)
			fmt.Println("unfenced landed", files, err)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-l.Lost()
	fmt.Printf("lost: %v (expiring closed: %v)\n", l.Err(), closed(l.Expiring()))
	select {}
}

// A holder paused (SIGSTOP) past its lease cannot write to a fenced
// resource when it wakes: a new holder took the lock over with a higher
// token and wrote first, so the woken holder's fenced write is refused,
// while the same write without the fence lands and overwrites the new
// holder's data: the failure fencing exists to prevent, shown not to be
// hypothetical.
func TestPausedHolderFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	pool, schema := testenv.PostgresSchema(t, 4)
	fencedSchema(t, pool)
	f, err := conditional.NewFenced("manifest", "name", "fence")
	if err != nil {
		t.Fatal(err)
	}
	const lease = 500 * time.Millisecond
	child := testenv.StartChild(t, "TestChildFencedWriter", envTable+"="+table,
		envDSN+"="+testenv.PostgresDSNFor(t, schema), envLease+"="+strconv.Itoa(int(lease/time.Millisecond)))
	line := child.WaitFor("acquired", 60*time.Second)
	old, _ := strconv.ParseInt(strings.TrimPrefix(line, "acquired token="), 10, 64)
	child.WaitFor("fenced ok", 30*time.Second)

	child.Pause()
	paused := time.Now()
	c := newClient(t, api, table, dynamolock.WithLease(lease))
	l := mustAcquire(t, c, "k")
	defer l.Close()
	if l.Token() <= old || time.Since(paused) < lease {
		t.Fatalf("took over after %v with token %d (paused holder's %d)", time.Since(paused), l.Token(), old)
	}
	if err := f.Update(ctx, pool, "segments", l.Token(), map[string]any{"files": "new-holder"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE unfenced SET files = 'new-holder' WHERE name = 'segments'"); err != nil {
		t.Fatal(err)
	}
	child.Resume()
	child.WaitFor("fenced refused", 30*time.Second)
	child.WaitFor("unfenced landed", 30*time.Second)
	lost := child.WaitFor("lost:", 30*time.Second)

	var files, unfenced string
	var fence int64
	if err := pool.QueryRow(ctx, "SELECT files, fence FROM manifest WHERE name = 'segments'").Scan(&files, &fence); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT files FROM unfenced WHERE name = 'segments'").Scan(&unfenced); err != nil {
		t.Fatal(err)
	}
	if files != "new-holder" || fence != l.Token() {
		t.Fatalf("manifest %q at fence %d; want the new holder's write at %d", files, fence, l.Token())
	}
	if !strings.HasPrefix(unfenced, "child-") {
		t.Fatalf("unfenced row %q: the paused holder's unfenced write should have landed over the new holder's", unfenced)
	}
	t.Logf("paused holder (token %d) woke: fenced write refused, unfenced write landed (%q); child said %q", old, unfenced, lost)
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
		c := newClient(t, api, table, dynamolock.WithLease(time.Second), dynamolock.WithPoll(20*time.Millisecond))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				l, err := c.Acquire(ctx, "hot")
				if err != nil {
					cancel()
					t.Error(err)
					return
				}
				_, err = pool.Exec(ctx, `UPDATE excl SET inside = inside + 1, entries = entries + 1,
  overlapped = overlapped + (inside > 0)::int, regressions = regressions + (last_token >= $1)::int,
  last_token = greatest(last_token, $1) WHERE id = 1`, l.Token())
				if err == nil {
					time.Sleep(time.Duration(1+r%3) * time.Millisecond)
					lost := 0
					if closed(l.Lost()) {
						lost = 1
					}
					_, err = pool.Exec(ctx, `UPDATE excl SET inside = inside - 1, lost = lost + $1 WHERE id = 1`, lost)
				}
				if rerr := l.Release(ctx); err == nil {
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
	if overlaps != 0 || regressions != 0 || inside != 0 || entries != want || lost != 0 {
		t.Fatalf("entries %d (want %d), overlaps %d, token regressions %d, inside %d, lost during hold %d; want 0s",
			entries, want, overlaps, regressions, inside, lost)
	}
	t.Logf("%d processes × 2 workers: %d entries, 0 overlaps, tokens up to %d", children+1, entries, last)
}
