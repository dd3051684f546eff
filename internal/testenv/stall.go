package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// HeldLock is what both lock packages' Locks have, for StallTrial.
type HeldLock interface {
	Key() string
	Token() int64
	Lost() <-chan struct{}
	Err() error
	Close() error
}

// Held returns locks as HeldLocks.
func Held[L HeldLock](locks []L) []HeldLock {
	held := make([]HeldLock, len(locks))
	for i, l := range locks {
		held[i] = l
	}
	return held
}

// Stall describes a lock store that a test can pause, and one Client's
// locks on it, for StallTrial.
type Stall struct {
	Name string // the package and store, for Figures
	// Hold returns the Client's locks for trial n (see Conclusive), held,
	// on keys no other trial uses.
	Hold             func(n int) []HeldLock
	Lease, Heartbeat time.Duration // the Client's
	// Backlog is how long the store may take, once resumed, to answer a
	// renewal of every lock (0: a heartbeat). The short pause leaves it
	// that and a heartbeat of the lease.
	Backlog       time.Duration
	Pause, Resume func() // stop the store (SIGSTOP), continue it
	// Probe asks the store something cheap (a write where the store
	// queues writes) through a client and a connection of its own, not
	// the locks', and returns once it is answered or ctx ends. Sent right
	// after the short pause's Resume, it queues behind the renewals the
	// store received in the pause: its answer says when the store had
	// caught up.
	Probe func(ctx context.Context) error
	// Calls is how many renewal calls the Client keeps in flight at most
	// when it renews each lock with a call of its own (0: one call renews
	// them all). A store that answered the Probe in time may still be too
	// slow to answer a call per lock within the Backlog: while the Client
	// renews its locks after the resume, the trial sends one Probe after
	// another, and a Probe that waits w on average (behind the Client's
	// calls in the store's queue) means the store answers about Calls
	// calls per w, so a renewal of every lock takes locks × w / Calls.
	// The measure holds for a Client that keeps at most Calls in flight
	// (lockcore's tests check the Keeper's bound).
	Calls int
	// Valid, if set, returns the end of a lock's validity on the
	// Client's clock. A lock with less than the lease minus a heartbeat
	// left when the store stops was renewed later than its heartbeat
	// asked (a store answering fewer renewals a second than the locks
	// need): the short pause promises such a lock nothing.
	Valid func(l HeldLock) time.Time
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
// up once resumed; by default a heartbeat): every lock must still be held
// once each has had two renewals confirmed after the resume (the second
// sent after the first returned, so after the resume), with its token,
// and the store must carry it. Then for the lease plus a heartbeat: every
// lock must end (Lost closed) with an expiry, while the store is still
// paused. The pauses are the injected faults; every step after one waits
// for observed events.
//
// A lock is kept while its renewals are answered within the lease, so a
// trial whose store did not answer in time checked nothing, and
// Conclusive runs another on fresh locks: where a lock found lost when
// the store has stopped for the first pause expired with a renewal
// unanswered (a store too busy to answer within the lease), and where
// the locks lost in the short pause all expired while the store, once
// resumed, left the Probe unanswered for longer than the Backlog, or
// would take longer than the Backlog to answer a call per lock, Calls at
// a time, at the pace of Probes sent while the Client renewed them (the
// measures of a store that did not catch up in time), or had,
// each, less than the lease minus a heartbeat left when the store
// stopped (Valid: renewals already behind their heartbeats). Any
// other loss fails the test, as does any loss in the short pause of a
// store that answered in time.
func StallTrial(t testing.TB, s Stall) {
	t.Helper()
	backlog := s.Backlog
	if backlog == 0 {
		backlog = s.Heartbeat
	}
	short := s.Lease - s.Heartbeat - backlog
	var locks []HeldLock
	var lost int
	var probed time.Duration
	Conclusive(t, func(n int) error {
		locks = s.Hold(n)
		Until(t, "a confirmed renewal of every lock (or a loss)", func() (bool, error) {
			for _, l := range locks {
				if l.Err() == nil && s.Renewed(l.Key()) == 0 {
					return false, nil
				}
			}
			return true, nil
		})
		s.Pause()
		paused := time.Now()
		behind := map[string]time.Duration{} // the locks renewed late before the pause: their time left
		if s.Valid != nil {
			for _, l := range locks {
				if left := s.Valid(l).Sub(paused); left < s.Lease-s.Heartbeat {
					behind[l.Key()] = left
				}
			}
		}
		expired := 0
		var first error
		for _, l := range locks {
			err := l.Err()
			switch {
			case err == nil:
			case s.Expired(err) && errors.Is(err, context.DeadlineExceeded):
				if expired++; expired == 1 {
					first = fmt.Errorf("lock %q: %w", l.Key(), err)
				}
			default:
				s.Resume()
				t.Fatalf("lock %q lost before any pause: %v", l.Key(), err)
			}
		}
		if expired != 0 {
			s.Resume()
			closeAll(locks)
			return fmt.Errorf("%d of %d locks expired before the pause, a renewal unanswered within the lease (the first, %w)", expired, len(locks), first)
		}

		time.Sleep(time.Until(paused.Add(short)))
		at := make(map[string]int, len(locks))
		for _, l := range locks {
			at[l.Key()] = s.Renewed(l.Key())
		}
		s.Resume()
		probed = probe(t, s).Round(time.Millisecond)
		pacer := pacing(s)
		defer pacer() // if Until fails the test
		Until(t, "two confirmed renewals of every lock (or its loss) after the resume", func() (bool, error) {
			for _, l := range locks {
				if l.Err() == nil && s.Renewed(l.Key()) < at[l.Key()]+2 {
					return false, nil
				}
			}
			return true, nil
		})
		pace, err := pacer()
		if err != nil {
			t.Fatal(err)
		}
		lost = 0
		var other error // the first loss not by an expiry
		late := 0       // the locks expired that were behind at the pause
		for _, l := range locks {
			err := l.Err()
			expiry := s.Expired(err)
			if err == nil {
				err = s.Stored(l)
			}
			if err == nil {
				continue
			}
			if _, ok := behind[l.Key()]; ok && expiry {
				late++
			}
			err = fmt.Errorf("lock %q (token %d) after a pause of %v: %w", l.Key(), l.Token(), short, err)
			if lost++; lost == 1 {
				first = err
			}
			if !expiry && other == nil {
				other = err
			}
		}
		var all time.Duration // a call per lock, Calls at a time, at the store's pace
		if s.Calls > 0 {
			all = (pace * time.Duration(len(locks)) / time.Duration(s.Calls)).Round(time.Millisecond)
		}
		switch {
		case lost == 0:
		case other == nil && probed > backlog:
			closeAll(locks)
			return fmt.Errorf("%d of %d locks expired in a pause of %v, and a probe after the resume waited %v (the store had %v; the first, %w)",
				lost, len(locks), short, probed, backlog, first)
		case other == nil && late == lost:
			closeAll(locks)
			return fmt.Errorf("%d of %d locks expired in a pause of %v, each with less than the lease minus a heartbeat (%v) left when the store stopped: renewed later than their heartbeats, by a store answering fewer renewals than they asked (%d locks behind; the first, %w)",
				lost, len(locks), short, s.Lease-s.Heartbeat, len(behind), first)
		case other == nil && all > backlog:
			closeAll(locks)
			return fmt.Errorf("%d of %d locks expired in a pause of %v; a probe after the resume waited %v, but while the locks were renewed a probe waited %v on average: a call per lock, %d at a time, takes %v at that pace (the store had %v; the first, %w)",
				lost, len(locks), short, probed, pace.Round(time.Millisecond), s.Calls, all, backlog, first)
		default:
			if other == nil {
				other = first
			}
			if all != 0 {
				t.Errorf("%v (a probe after the resume waited %v; at the pace of the probes while the locks were renewed, a call per lock takes %v; the store had %v)", other, probed, all, backlog)
			} else {
				t.Errorf("%v (a probe after the resume waited %v; the store had %v)", other, probed, backlog)
			}
		}
		return nil
	})

	long := s.Lease + s.Heartbeat
	s.Pause()
	time.Sleep(long)
	Until(t, "every lock lost in the long pause", func() (bool, error) {
		for _, l := range locks {
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
	for _, l := range locks {
		if s.Expired(l.Err()) {
			expired++
			continue
		}
		if other++; other == 1 {
			t.Errorf("lock %q after a pause of %v: %v, want its expiry", l.Key(), long, l.Err())
		}
	}
	Figures(t, s.Name+" paused", "%d locks (lease %v, heartbeat %v): paused %v, a probe after the resume waited %v (the store had %v), %d lost (want 0); paused %v, %d expired (want %d)",
		len(locks), s.Lease, s.Heartbeat, short, probed, backlog, lost, long, expired, len(locks))
	if lost != 0 || expired != len(locks) {
		t.Fatalf("%d of %d locks lost in a pause of %v (want 0); %d expired in a pause of %v (want all)", lost, len(locks), short, expired, long)
	}
}

// probe sends s.Probe, bounded by the lease, and returns how long it
// waited for the answer (the lease, if none came).
func probe(t testing.TB, s Stall) time.Duration {
	t.Helper()
	waited, err := probeOnce(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return waited
}

// probeOnce is probe without the test, under ctx: it returns the
// Probe's error if the Probe failed before the lease ran out or ctx
// ended.
func probeOnce(ctx context.Context, s Stall) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Lease)
	defer cancel()
	start := time.Now()
	err := s.Probe(ctx)
	waited := time.Since(start)
	if err != nil && ctx.Err() == nil {
		return waited, fmt.Errorf("testenv: probe of the resumed store: %w", err)
	}
	return waited, nil
}

// pacing sends one Probe after another, each bounded by the lease, until
// stop is called. stop ends them, waits for the goroutine that sends
// them, and returns how long they waited on average (one cut short by
// stop counted for the time it had waited; 0 if none was sent), or the
// first Probe's error; it may be called again. The Probe sent right
// after the resume, which waits for the pause's backlog, is not among
// them.
func pacing(s Stall) (stop func() (time.Duration, error)) {
	if s.Calls == 0 {
		return func() (time.Duration, error) { return 0, nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		mean time.Duration
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var sum time.Duration
		n := 0
		for ctx.Err() == nil {
			waited, err := probeOnce(ctx, s)
			if err != nil {
				done <- result{err: err}
				return
			}
			sum, n = sum+waited, n+1
		}
		var r result
		if n > 0 {
			r.mean = sum / time.Duration(n)
		}
		done <- r
	}()
	return sync.OnceValues(func() (time.Duration, error) {
		cancel()
		r := <-done
		return r.mean, r.err
	})
}

// closeAll closes the locks of an inconclusive trial: the lost ones
// report their loss; the others are released.
func closeAll(locks []HeldLock) {
	for _, l := range locks {
		l.Close()
	}
}
