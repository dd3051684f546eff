package testenv_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// parkHere parks its goroutine until release is closed.
func parkHere(release <-chan struct{}) { <-release }

// WaitParked counts the goroutines its caller started that wait in the
// function named, and no others: those of another goroutine, and those
// that wait elsewhere, are left out.
func TestWaitParkedCountsOwnGoroutines(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	// Another goroutine's children park in the same function.
	others := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); parkHere(release) }()
		}
		for testenv.Parked("testenv_test.parkHere") < 3 {
			runtime.Gosched()
		}
		close(others)
	}()
	<-others
	wg.Add(1)
	go func() { defer wg.Done(); <-release }() // parked elsewhere
	for i := 1; i <= 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); parkHere(release) }()
		testenv.WaitParked(t, i, "testenv_test.parkHere")
	}
	if n := testenv.Parked("testenv_test.parkHere"); n != 2 {
		t.Fatalf("%d goroutines of this test parked in parkHere, want 2", n)
	}
}

// A Cutter closes the connections open through it, and lets later ones
// pass.
func TestCutterCutsOpenConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cut := testenv.NewCutter()
	dsn := testenv.Proxy(t, testenv.PostgresDSN(t), cut.Wrap(nil), cut.Wrap(nil))
	pool := testenv.Pool(t, dsn, 1)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := cut.Cut(); n == 0 {
		t.Fatal("the cut closed nothing")
	}
	err = conn.QueryRow(ctx, "SELECT 1").Scan(new(int))
	conn.Release()
	if err == nil {
		t.Fatal("a query on a cut connection succeeded")
	}
	pool.Reset()
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(new(int)); err != nil {
		t.Fatalf("a new connection after the cut: %v", err)
	}
}

// An armed ReplyDropper swallows the reply whose tag it was made for, once:
// the statement ran, its caller hears nothing.
func TestReplyDropperDropsOneReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 1)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	drop := testenv.DropReply("INSERT 0 1")
	via := testenv.Pool(t, testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), nil, drop.Relay), 1)
	drop.Arm()
	if _, err := via.Exec(ctx, `INSERT INTO t VALUES (1)`); err == nil || drop.Dropped() != 1 {
		t.Fatalf("insert whose reply was dropped: %v after %d drops, want an error after 1", err, drop.Dropped())
	}
	if _, err := via.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("the next insert, unarmed: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows (%v), want 2: the dropped reply's insert ran", n, err)
	}
}

// RunTrials runs every trial once, each worker its share, and stops
// handing out trials once the test has failed; Poll reports, not fails.
func TestRunTrialsAndPoll(t *testing.T) {
	t.Parallel()
	var ran [10]atomic.Int64
	testenv.RunTrials(t, len(ran), 3, func(w, i int) {
		if i%3 != w {
			t.Errorf("trial %d ran on worker %d", i, w)
		}
		ran[i].Add(1)
	})
	for i := range ran {
		if ran[i].Load() != 1 {
			t.Fatalf("trial %d ran %d times, want once", i, ran[i].Load())
		}
	}
	boom := errors.New("boom")
	if err := testenv.Poll("a failing probe", func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("Poll of a failing probe: %v, want its error", err)
	}
	calls := 0
	if err := testenv.Poll("the third call", func() (bool, error) { calls++; return calls == 3, nil }); err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls, want nil after 3", err, calls)
	}
}
