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
