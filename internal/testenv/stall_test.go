package testenv_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
)

// fakeExpiry is fakeStore's loss by expiry, with the last renewal's error.
type fakeExpiry struct{ last error }

func (e *fakeExpiry) Error() string { return fmt.Sprintf("lease expired (last error: %v)", e.last) }
func (e *fakeExpiry) Unwrap() error { return e.last }

// unanswered is a fakeStore lock's expiry with its renewal unanswered.
var unanswered = &fakeExpiry{fmt.Errorf("a renewal had no answer: %w", context.DeadlineExceeded)}

// fakeLock is a HeldLock of fakeStore.
type fakeLock struct {
	key    string
	lost   chan struct{}
	mu     sync.Mutex
	err    error
	closed bool
}

func (l *fakeLock) Key() string           { return l.key }
func (l *fakeLock) Token() int64          { return 1 }
func (l *fakeLock) Lost() <-chan struct{} { return l.lost }

func (l *fakeLock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *fakeLock) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return l.err
}

func (l *fakeLock) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = err
		close(l.lost)
	}
}

// fakeStore is a lock store for StallTrial: it confirms a renewal of a
// lock whenever asked while it runs, and every lock of a trial expires
// in the trial's second pause. lose, if set, loses a lock at a step of
// the first trial; late, if set, keeps the first trial's probe waiting
// for lateBy; slow, if set, keeps each of the first trial's probes
// waiting for half of that, and its locks unrenewed after the short pause
// until three probes have been answered.
type fakeStore struct {
	lose   func(step string, l *fakeLock)
	late   bool
	slow   bool
	behind bool // the first trial's locks have no time left at the pause

	mu      sync.Mutex
	trials  [][]*fakeLock
	paused  bool
	pauses  int // of the latest trial's locks
	probes  int // answered since the latest resume
	renewed map[string]int
}

func (s *fakeStore) hold(n int) []testenv.HeldLock {
	s.mu.Lock()
	defer s.mu.Unlock()
	locks := make([]*fakeLock, 3)
	for i := range locks {
		locks[i] = &fakeLock{key: fmt.Sprintf("s%d-%d", n, i), lost: make(chan struct{})}
	}
	s.trials = append(s.trials, locks)
	s.pauses = 0
	if n == 1 {
		s.lose("hold", locks[1])
	}
	return testenv.Held(locks)
}

func (s *fakeStore) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = true
	if s.pauses++; s.pauses == 2 {
		for _, l := range s.trials[len(s.trials)-1] {
			l.lose(unanswered)
		}
	}
}

func (s *fakeStore) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused, s.probes = false, 0
	if len(s.trials) == 1 && s.pauses == 1 {
		s.lose("resume", s.trials[0][1])
	}
}

// lateBy is how long a late fakeStore answers its probe: longer than
// the backlog of the fake's trials.
const lateBy = time.Second

func (s *fakeStore) probe(context.Context) error {
	s.mu.Lock()
	late, slow := s.late && len(s.trials) == 1, s.slow && len(s.trials) == 1
	s.mu.Unlock()
	switch {
	case late:
		time.Sleep(lateBy)
	case slow:
		time.Sleep(lateBy / 2)
	}
	s.mu.Lock()
	s.probes++
	s.mu.Unlock()
	return nil
}

func (s *fakeStore) valid(l testenv.HeldLock) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.behind && len(s.trials) == 1 {
		return time.Now()
	}
	return time.Now().Add(time.Hour)
}

func (s *fakeStore) renewals(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A slow store renews the locks after the short pause only as fast
	// as it answers probes: after the one sent at the resume and two more.
	if !s.paused && !(s.slow && len(s.trials) == 1 && s.pauses == 1 && s.probes < 3) {
		s.renewed[key]++
	}
	return s.renewed[key]
}

// StallTrial runs another trial, on fresh locks (the first trial's
// closed), when a lock expired with its renewal unanswered before the
// first pause, or in the short pause while the resumed store left the
// probe waiting longer than the backlog (whatever the expiry's last
// error) or, at the pace of the probes sent while the locks were
// renewed, would answer a call per lock, one at a time, later than that; a
// lock lost before the pause otherwise, one taken in the short
// pause, or one expired in it while the store answered the probe in time,
// fails the test.
func TestStallTrialRetriesWhatTheStoreBroke(t *testing.T) {
	t.Parallel()
	at := func(step string, err error) func(string, *fakeLock) {
		return func(s string, l *fakeLock) {
			if s == step {
				l.lose(err)
			}
		}
	}
	taken := errors.New("taken over")
	for _, tc := range []struct {
		name    string
		lose    func(step string, l *fakeLock)
		late    bool
		slow    bool
		behind  bool
		trials  int
		retried string // the first trial's log line, if it was inconclusive
		failed  string // a line logged, "" if the test passes
	}{
		{"expired before the pause", at("hold", unanswered), false, false, false,
			2, "1 of 3 locks expired before the pause", ""},
		{"taken over before the pause", at("hold", taken), false, false, false,
			1, "", `lock "s1-1" lost before any pause: taken over`},
		{"expired in the short pause, the store in time", at("resume", unanswered), false, false, false,
			1, "", "1 of 3 locks lost in a pause of 90ms (want 0)"},
		{"expired in the short pause, the store late", at("resume", unanswered), true, false, false,
			2, "1 of 3 locks expired in a pause of 90ms, and a probe after the resume waited", ""},
		{"expired in the short pause, the store too slow for a call per lock", at("resume", unanswered), false, true, false,
			2, "1 of 3 locks expired in a pause of 90ms; a probe after the resume waited", ""},
		{"expired in the short pause, renewed late before it", at("resume", unanswered), false, false, true,
			2, "1 of 3 locks expired in a pause of 90ms, each with less than the lease minus a heartbeat", ""},
		{"expired with another error in the short pause, the store late", at("resume", &fakeExpiry{errors.New("i/o timeout")}), true, false, false,
			2, "1 of 3 locks expired in a pause of 90ms, and a probe after the resume waited", ""},
		{"taken over in the short pause, the store late", at("resume", taken), true, false, false,
			1, "", "1 of 3 locks lost in a pause of 90ms (want 0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &fakeStore{lose: tc.lose, late: tc.late, slow: tc.slow, behind: tc.behind, renewed: map[string]int{}}
			r := &recorder{TB: t}
			r.run(func(tb testing.TB) {
				testenv.StallTrial(tb, testenv.Stall{
					Name: "fake", Hold: s.hold,
					Lease: time.Second, Heartbeat: 10 * time.Millisecond, Backlog: lateBy - 100*time.Millisecond,
					Pause: s.pause, Resume: s.resume, Probe: s.probe, Calls: 1, Valid: s.valid, Renewed: s.renewals,
					Stored: func(testenv.HeldLock) error { return nil },
					Expired: func(err error) bool {
						var e *fakeExpiry
						return errors.As(err, &e)
					},
				})
			})
			if tc.failed == "" && r.Failed() || tc.failed != "" && !r.logged(tc.failed) || len(s.trials) != tc.trials {
				t.Fatalf("%d trials, failed %v, logged %q; want %d trials and a line with %q", len(s.trials), r.Failed(), r.logs, tc.trials, tc.failed)
			}
			if tc.trials > 1 {
				for _, l := range s.trials[0] {
					if !l.closed {
						t.Errorf("lock %s of the inconclusive trial left open", l.key)
					}
				}
				if !r.logged("trial 1 of at most 6 inconclusive: "+tc.retried) || !r.logged("FIGURES fake paused: 3 locks") {
					t.Errorf("logged %q", r.logs)
				}
			}
		})
	}
}
