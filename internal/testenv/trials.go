package testenv

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// RunTrials runs trial(w, i) for every i in [0, n) on workers goroutines,
// worker w taking the trials i = w, w+workers, w+2·workers, ..., so that
// each worker can own its fixtures (a proxy, a pool, an account). A trial
// reports a broken invariant with t.Error or t.Errorf (not Fatal: it runs
// on its own goroutine) and returns; once the test has failed, no further
// trial starts. RunTrials returns when every worker has stopped.
func RunTrials(t testing.TB, n, workers int, trial func(w, i int)) {
	t.Helper()
	workers = max(1, min(workers, n))
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n && !t.Failed(); i += workers {
				trial(w, i)
			}
		}()
	}
	wg.Wait()
}

// Poll is Until for a goroutine other than the test's (a trial of
// RunTrials): it returns an error instead of failing the test, when cond
// returns one or has not held within a minute (scaled).
func Poll(what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(Scale(time.Minute))
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("testenv: waiting until %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: %s did not happen within %v", what, Scale(time.Minute))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// conclusiveTries is how many trials Conclusive runs at most: one, and
// five more when the machine broke a trial's precondition.
const conclusiveTries = 6

// Conclusive runs trial(1), trial(2), ... until one is conclusive, at
// most six times. A trial returns nil once it has checked what the test
// checks (failing the test, as usual, where the code broke a promise), or
// an error saying why it could not: a precondition that the machine, not
// the code, broke before the fault the trial injects (a lock that expired
// because a busy server left its renewal unanswered within the lease,
// before the pause). Such a trial is logged and the next one runs, on
// fixtures of its own (keys named by its number); a trial that failed the
// test ends the run. Conclusive fails the test if every trial was
// inconclusive: it tested nothing. It also stops, failing the same way,
// before a trial that would not end before the test binary's deadline
// (go test -timeout) at the pace of the slowest so far: a run cut by the
// deadline loses every test of its package.
func Conclusive(t testing.TB, trial func(n int) error) {
	t.Helper()
	var why error
	var slowest time.Duration
	for n := 1; n <= conclusiveTries; n++ {
		if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok && n > 1 {
			if end, ok := d.Deadline(); ok && time.Until(end) < 2*slowest {
				t.Fatalf("%d trials inconclusive, the last: %v; no time left for another before the test deadline: the test tested nothing", n-1, why)
			}
		}
		start := time.Now()
		why = trial(n)
		slowest = max(slowest, time.Since(start))
		if why == nil || t.Failed() {
			if n > 1 && why == nil {
				t.Logf("%d inconclusive trials before a conclusive one", n-1)
			}
			return
		}
		t.Logf("trial %d of at most %d inconclusive: %v", n, conclusiveTries, why)
	}
	t.Fatalf("all %d trials inconclusive, the last: %v: the test tested nothing", conclusiveTries, why)
}
