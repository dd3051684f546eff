package testenv_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// recorder is a test's testing.TB that keeps what is logged and a
// failure to itself, so that a test can check how a helper fails.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	logs   []string
	failed bool
}

func (r *recorder) Helper() {}

func (r *recorder) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) Errorf(format string, args ...any) {
	r.Logf(format, args...)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// run calls f with r on a goroutine of its own (Fatal ends it), and
// returns once f has returned or ended.
func (r *recorder) run(f func(t testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

func (r *recorder) logged(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.logs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// Conclusive runs trials until one is conclusive, logging each
// inconclusive one; it fails the test when all six were inconclusive, and
// runs no further trial once one failed the test.
func TestConclusive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		conclusive int // the first conclusive trial, 0 for none
		fails      int // the trial that fails the test, 0 for none
		runs       int
		failed     bool
		log        string
	}{
		{"first", 1, 0, 1, false, ""},
		{"third", 3, 0, 3, false, "2 inconclusive trials before a conclusive one"},
		{"none", 0, 0, 6, true, "all 6 trials inconclusive, the last: trial 6: precondition broken: the test tested nothing"},
		{"a failure ends the run", 0, 2, 2, true, "trial 1 of at most 6 inconclusive: trial 1: precondition broken"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{TB: t}
			runs := 0
			r.run(func(tb testing.TB) {
				testenv.Conclusive(tb, func(n int) error {
					runs++
					if n == tc.fails {
						tb.Errorf("trial %d: a broken promise", n)
					}
					if n == tc.conclusive {
						return nil
					}
					return fmt.Errorf("trial %d: %w", n, errors.New("precondition broken"))
				})
			})
			if runs != tc.runs || r.Failed() != tc.failed || tc.log != "" && !r.logged(tc.log) {
				t.Fatalf("%d trials, failed %v, logged %q; want %d trials, failed %v, a line with %q", runs, r.Failed(), r.logs, tc.runs, tc.failed, tc.log)
			}
		})
	}
}
