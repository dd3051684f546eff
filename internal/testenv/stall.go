package testenv

import (
	"fmt"
	"testing"
	"time"
)

// HeldLock is what both lock packages' Locks have, for StallTrial.
type HeldLock interface {
	Key() string
	Token() int64
	Lost() <-chan struct{}
	Err() error
}

// Stall describes a lock store that a test can pause, and one Client's
// locks on it, for StallTrial.
type Stall struct {
	Name             string // the package and store, for Figures
	Locks            []HeldLock
	Lease, Heartbeat time.Duration // the Client's
	// Backlog is how long the store may take, once resumed, to answer a
	// renewal of every lock (0: a heartbeat). The short pause leaves it
	// that and a heartbeat of the lease.
	Backlog       time.Duration
	Pause, Resume func() // stop the store (SIGSTOP), continue it
	// Renewed returns how many renewals of the lock key the Client's
	// observer has seen confirmed so far.
	Renewed func(key string) int
	// Stored returns nil if the store carries the lock l as held by its
	// Client with l's token, else what it carries.
	Stored func(l HeldLock) error
	// Expired reports whether err is the package's loss for an expiry
	// (its LostError with the cause Expired).
	Expired func(err error) bool
}

// StallTrial pauses the store twice and counts the locks lost. First for
// the lease minus a heartbeat and the Backlog (the store's time to catch
// up once resumed; by default a heartbeat): every lock must still
// be held once each has had two renewals confirmed after the resume (the
// second sent after the first returned, so after the resume), with its
// token, and the store must carry it. Then for the lease plus a
// heartbeat: every lock must end (Lost closed) with an expiry, while the
// store is still paused. The pauses are the injected faults; every step
// after one waits for observed events. Run it once the locks are held.
func StallTrial(t testing.TB, s Stall) {
	t.Helper()
	Until(t, "a confirmed renewal of every lock", func() (bool, error) {
		for _, l := range s.Locks {
			if err := l.Err(); err != nil {
				return false, fmt.Errorf("lock %q lost before any pause: %w", l.Key(), err)
			}
			if s.Renewed(l.Key()) == 0 {
				return false, nil
			}
		}
		return true, nil
	})

	backlog := s.Backlog
	if backlog == 0 {
		backlog = s.Heartbeat
	}
	short := s.Lease - s.Heartbeat - backlog
	s.Pause()
	time.Sleep(short)
	at := make(map[string]int, len(s.Locks))
	for _, l := range s.Locks {
		at[l.Key()] = s.Renewed(l.Key())
	}
	s.Resume()
	Until(t, "two confirmed renewals of every lock (or its loss) after the resume", func() (bool, error) {
		for _, l := range s.Locks {
			if l.Err() == nil && s.Renewed(l.Key()) < at[l.Key()]+2 {
				return false, nil
			}
		}
		return true, nil
	})
	lost := 0
	for _, l := range s.Locks {
		err := l.Err()
		if err == nil {
			err = s.Stored(l)
		}
		if err != nil {
			if lost == 0 {
				t.Errorf("lock %q (token %d) after a pause of %v: %v", l.Key(), l.Token(), short, err)
			}
			lost++
		}
	}

	long := s.Lease + s.Heartbeat
	s.Pause()
	time.Sleep(long)
	Until(t, "every lock lost in the long pause", func() (bool, error) {
		for _, l := range s.Locks {
			select {
			case <-l.Lost():
			default:
				return false, nil
			}
		}
		return true, nil
	})
	s.Resume()
	expired, other := 0, 0
	for _, l := range s.Locks {
		if s.Expired(l.Err()) {
			expired++
			continue
		}
		if other++; other == 1 {
			t.Errorf("lock %q after a pause of %v: %v, want its expiry", l.Key(), long, l.Err())
		}
	}
	Figures(t, s.Name+" paused", "%d locks (lease %v, heartbeat %v): paused %v, %d lost (want 0); paused %v, %d expired (want %d)",
		len(s.Locks), s.Lease, s.Heartbeat, short, lost, long, expired, len(s.Locks))
	if lost != 0 || expired != len(s.Locks) {
		t.Fatalf("%d of %d locks lost in a pause of %v (want 0); %d expired in a pause of %v (want all)", lost, len(s.Locks), short, expired, long)
	}
}
