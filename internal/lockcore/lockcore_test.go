package lockcore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCheckDefaultsAndRefusals(t *testing.T) {
	s := Defaults()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if s.Heartbeat != 5*time.Second || s.Warn != 5*time.Second || s.Poll != time.Second || s.Owner == "" {
		t.Fatalf("defaults: %+v", s)
	}
	for _, tc := range []struct {
		name string
		set  func(*Settings)
		want string
	}{
		{"zero lease", func(s *Settings) { s.Lease = 0 }, "lease"},
		{"long lease", func(s *Settings) { s.Lease = MaxLease + 1 }, "lease"},
		{"heartbeat above half", func(s *Settings) { s.Heartbeat, s.Set.Heartbeat = 11*time.Second, true }, "heartbeat"},
		{"zero poll", func(s *Settings) { s.Poll, s.Set.Poll = 0, true }, "poll"},
		{"warning too late", func(s *Settings) { s.Warn, s.Set.Warn = 15*time.Second, true }, "expiry warning"},
		{"empty owner", func(s *Settings) { s.Owner, s.Set.Owner = "", true }, "WithOwner"},
		{"NUL owner", func(s *Settings) { s.Owner, s.Set.Owner = "a\x00", true }, "owner"},
		{"nil clock", func(s *Settings) { s.Now = nil }, "clock"},
	} {
		s := Defaults()
		tc.set(&s)
		if err := s.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", tc.name, err, tc.want)
		}
	}
	if err := CheckAcquire(0, true, 0, false); err == nil {
		t.Error("a zero wait was accepted")
	}
	if err := CheckAcquire(0, false, -1, true); err == nil {
		t.Error("a negative max hold was accepted")
	}
	if err := CheckAcquire(0, false, time.Millisecond, true); err != nil {
		t.Errorf("a max hold shorter than the lease: %v", err)
	}
}

func TestEventsOf(t *testing.T) {
	e := EventsOf("lease")
	if e.Acquired != "lease.acquired" || e.RenewFailed != "lease.renew_failed" || e.NotAcquired != "lease.not_acquired" {
		t.Fatalf("%+v", e)
	}
}

// fake is a Backend whose renewals count how many run at once.
type fake struct {
	mu          sync.Mutex
	now, most   int
	renewed     map[*Hold]int
	lease       time.Duration
	hold        chan struct{} // each renewal waits for a value, or its end; nil: none waits
	fail        error         // each renewal's error
	released    int
	batchesSeen []int
	started     chan struct{} // if set, gets a value as each renewal starts, while it has room
	losses      map[*Hold]*Loss
}

func (f *fake) Renew(ctx context.Context, hs []*Hold) []Renewed {
	f.mu.Lock()
	f.now++
	f.most = max(f.most, f.now)
	f.batchesSeen = append(f.batchesSeen, len(hs))
	f.mu.Unlock()
	select {
	case f.started <- struct{}{}: // nil: never
	default:
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
		}
	}
	at := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now--
	out := make([]Renewed, len(hs))
	for i, h := range hs {
		f.renewed[h]++
		out[i] = Renewed{At: at, Valid: at.Add(f.lease), Err: f.fail}
	}
	return out
}

func (f *fake) Release(ctx context.Context, h *Hold) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.released++
	return nil
}

func (f *fake) Lost(h *Hold, loss *Loss) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.losses != nil {
		f.losses[h] = loss
	}
	return errLost
}

var (
	errLost     = errors.New("test: lost")
	errReleased = errors.New("test: released")
	errClosed   = errors.New("test: closed")
)

// keep runs n locks on a Keeper with cfg's Batch and MaxCalls over a fake
// backend until each was renewed three times, and returns the backend.
func keep(t *testing.T, batch bool, maxCalls, n int) *fake {
	t.Helper()
	s := Defaults()
	s.Lease, s.Heartbeat, s.Set.Heartbeat = time.Minute, 20*time.Millisecond, true
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	f := &fake{renewed: map[*Hold]int{}, lease: s.Lease, hold: make(chan struct{})}
	k := NewKeeper(Config{Settings: s, Batch: batch, MaxCalls: maxCalls, Prefix: "test", Events: EventsOf("test"),
		Closed: errClosed, Released: errReleased, LockLost: errLost, NotAcquired: errors.New("test: held")}, f)
	hs := make([]*Hold, n)
	// Acquired a second from now, as far as the Keeper knows: no lock's
	// first renewal falls due before all n are added, however slow the
	// machine, so the renewals start together (Jitter spreads them within
	// a heartbeat).
	start := time.Now().Add(time.Second)
	for i := range hs {
		hs[i] = k.NewHold(context.Background(), fmt.Sprint(i), 1, start, 0)
		if err := k.Add(hs[i]); err != nil {
			t.Fatal(err)
		}
	}
	stop, fed := make(chan struct{}), make(chan struct{})
	go func() { // lets the renewals answer, one at a time
		defer close(fed)
		for {
			select {
			case f.hold <- struct{}{}:
			case <-stop:
				return
			}
		}
	}()
	testenv.Until(t, "three renewals of every lock", func() (bool, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, h := range hs {
			if f.renewed[h] < 3 {
				return false, nil
			}
		}
		return true, nil
	})
	close(stop)
	<-fed
	if err := k.Close(nil); err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if err := h.Err(); !errors.Is(err, errReleased) {
			t.Fatalf("lock %d after Close: %v", i, err)
		}
	}
	if f.released != n {
		t.Fatalf("%d releases; want %d", f.released, n)
	}
	return f
}

// Without batching, at most MaxCalls renewals run at once, and every lock
// is still renewed.
func TestMaxCalls(t *testing.T) {
	f := keep(t, false, 3, 20)
	if f.most > 3 {
		t.Fatalf("%d renewals at once; want at most 3", f.most)
	}
}

// With batching, one call renews every lock, and calls never overlap.
func TestBatchOneCall(t *testing.T) {
	f := keep(t, true, 0, 20)
	if f.most != 1 {
		t.Fatalf("%d renewal calls at once; want 1", f.most)
	}
	full := 0
	for _, n := range f.batchesSeen {
		if n == 20 {
			full++
		}
	}
	if full < 2 {
		t.Fatalf("batches %v; want the locks renewed together", f.batchesSeen)
	}
}

// onClock returns a Keeper with cfg's Batch and MaxCalls over a fake
// backend whose clock reads *now, closed when the test ends; its loop
// never runs, so a test calls settle itself.
func onClock(t *testing.T, now *time.Time, cfg Config) *Keeper {
	t.Helper()
	s := Defaults()
	s.Now = func() time.Time { return *now }
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	k := NewKeeper(Config{Settings: s, Batch: cfg.Batch, MaxCalls: cfg.MaxCalls, Prefix: "test", Events: EventsOf("test"),
		Closed: errClosed, Released: errReleased, LockLost: errLost, NotAcquired: errors.New("test: held")}, &fake{renewed: map[*Hold]int{}})
	t.Cleanup(func() { k.Close(nil) })
	return k
}

// A failed renewal is retried at once only when its call reached its time
// bound; an error that merely wraps context.DeadlineExceeded (a client's
// own timeout, well inside the bound) waits for the backoff.
func TestRetryAtOnceOnlyAfterTheCut(t *testing.T) {
	t0 := time.Now()
	k := onClock(t, &t0, Config{Batch: true})
	timeout := fmt.Errorf("client timeout: %w", context.DeadlineExceeded)
	for _, cut := range []bool{false, true} {
		h := k.NewHold(context.Background(), "k", 1, t0, 0)
		k.settle(results{c: &call{at: t0}, hs: []*Hold{h}, rs: []Renewed{{At: t0, Err: timeout}}, cut: cut})
		if atOnce := !h.next.After(t0); atOnce != cut {
			t.Errorf("call cut at its bound %v: next renewal in %v; want at once only after the cut", cut, h.next.Sub(t0))
		}
	}
}

// A renewal call waits at most three quarters of the time its lock has
// left; the retry after a call cut off at that bound waits for all that is
// left (none can follow it), and the next call after a confirmed renewal
// is bounded at three quarters again.
func TestRetryAfterTheCutWaitsAllThatIsLeft(t *testing.T) {
	t0 := time.Now()
	k := onClock(t, &t0, Config{MaxCalls: 8})
	h := k.NewHold(context.Background(), "k", 1, t0, 0)
	send := func(at time.Time) (time.Duration, results) {
		k.start([]*Hold{h}, at)
		h.mu.Lock()
		c := h.call
		h.mu.Unlock()
		c.cancel()
		return c.bound, <-k.results
	}
	lease := k.cfg.Lease
	at := t0.Add(lease / 2)
	bound, r := send(at)
	if want := lease / 2 * 3 / 4; bound != want {
		t.Fatalf("first call's bound %v; want three quarters of the %v left, %v", bound, lease/2, want)
	}
	r.cut, r.rs[0].Err = true, context.DeadlineExceeded
	at = at.Add(bound)
	t0 = at
	k.settle(r)
	bound, r = send(at)
	if want := h.ValidUntil().Sub(at); bound != want {
		t.Fatalf("retry after the cut: bound %v; want all that is left, %v", bound, want)
	}
	r.rs[0] = Renewed{At: at, Valid: at.Add(lease)}
	k.settle(r)
	if bound, _ = send(at); bound != lease*3/4 {
		t.Fatalf("call after a confirmed renewal: bound %v; want %v", bound, lease*3/4)
	}
}

// The bound on calls in flight starts at StartCalls, rises by one per
// bound's worth of calls answered within a quarter of their time bound
// while all it allowed were in flight, up to MaxCalls; it halves, down to
// StartCalls, when a call takes longer or is cut off, once for the calls
// sent before that.
func TestCallsFollowRoundTrips(t *testing.T) {
	t0 := time.Now()
	k := onClock(t, &t0, Config{MaxCalls: 20})
	h := k.NewHold(context.Background(), "k", 1, t0, 0)
	answer := func(sent time.Time, full, cut bool) {
		k.calls = 1
		if full {
			k.calls = int(k.window)
		}
		c := &call{at: sent, bound: time.Second}
		k.settle(results{c: c, hs: []*Hold{h}, rs: []Renewed{{At: sent, Valid: t0.Add(time.Minute)}}, cut: cut})
	}
	if k.window != StartCalls {
		t.Fatalf("window %v at the start; want %d", k.window, StartCalls)
	}
	fast := t0.Add(-10 * time.Millisecond) // a quarter of the bound is 250 ms
	answer(fast, false, false)
	if k.window != StartCalls {
		t.Fatalf("window %v after a fast answer with room to spare; want it unchanged", k.window)
	}
	for range StartCalls + 1 {
		answer(fast, true, false)
	}
	if int(k.window) != StartCalls+1 {
		t.Fatalf("window %v after %d fast answers while full; want %d", k.window, StartCalls+1, StartCalls+1)
	}
	for range 1000 {
		answer(fast, true, false)
	}
	if k.window != 20 {
		t.Fatalf("window %v after many fast answers; want MaxCalls, 20", k.window)
	}
	slow := t0.Add(-300 * time.Millisecond)
	answer(slow, false, false)
	if k.window != 10 {
		t.Fatalf("window %v after a slow answer; want 10", k.window)
	}
	answer(slow, false, false) // sent before the bound shrank
	if k.window != 10 {
		t.Fatalf("window %v after a second slow call sent before the first answered; want 10", k.window)
	}
	for i := range 10 {
		t0 = t0.Add(time.Second)
		answer(t0.Add(-300*time.Millisecond), false, i%2 == 0) // sent after the last shrink; cut, or slow
	}
	if k.window != StartCalls {
		t.Fatalf("window %v after slow calls and cuts; want StartCalls, %d", k.window, StartCalls)
	}
}

// A lock whose renewal is due while the Keeper has MaxCalls in flight
// waits for one of them to answer; if its lease runs out meanwhile, its
// loss says so, as a renewal unanswered (context.DeadlineExceeded), not
// as a paused process.
func TestExpiryWaitingForRoomSaysSo(t *testing.T) {
	s := Defaults()
	s.Lease = time.Second
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	f := &fake{renewed: map[*Hold]int{}, lease: s.Lease, hold: make(chan struct{}),
		started: make(chan struct{}, 2), losses: map[*Hold]*Loss{}}
	k := NewKeeper(Config{Settings: s, MaxCalls: 1, Prefix: "test", Renewal: "heartbeat", Events: EventsOf("test"),
		Closed: errClosed, Released: errReleased, LockLost: errLost, NotAcquired: errors.New("test: held")}, f)
	defer k.Close(nil)
	// a's renewal is sent at once and never answered, b's is due at once
	// with 300ms of its lease left (more than a heartbeat, so Add does not
	// renew it itself), less than the 560ms a's call may wait.
	a := k.NewHold(context.Background(), "a", 1, time.Now().Add(-s.Heartbeat), 0)
	if err := k.Add(a); err != nil {
		t.Fatal(err)
	}
	<-f.started
	b := k.NewHold(context.Background(), "b", 1, time.Now().Add(300*time.Millisecond-s.Lease), 0)
	if err := k.Add(b); err != nil {
		t.Fatal(err)
	}
	<-b.Lost()
	f.mu.Lock()
	loss := f.losses[b]
	f.mu.Unlock()
	if loss == nil || loss.Cause != Expired || !errors.Is(loss.Last, context.DeadlineExceeded) ||
		!strings.Contains(loss.Last.Error(), "test: a heartbeat due") || !strings.Contains(loss.Last.Error(), "waited for one of the 1 in flight to answer") {
		t.Fatalf("b's loss %+v, want an expiry whose heartbeat waited for the one in flight", loss)
	}
}

// A lock whose acquiring call was answered after its lease had run out
// (sent a lease and a half ago) is renewed before Add returns: held, valid
// from that renewal. If the renewal fails, the lock expires and its loss
// says that the acquiring call was answered late.
func TestAddRenewsALockAcquiredLate(t *testing.T) {
	for _, fail := range []error{nil, errors.New("test: store unreachable")} {
		t.Run(fmt.Sprint(fail), func(t *testing.T) {
			s := Defaults()
			s.Lease = time.Second
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
			f := &fake{renewed: map[*Hold]int{}, lease: s.Lease, fail: fail, losses: map[*Hold]*Loss{}}
			k := NewKeeper(Config{Settings: s, MaxCalls: 8, Prefix: "test", Renewal: "heartbeat", Events: EventsOf("test"),
				Closed: errClosed, Released: errReleased, LockLost: errLost, NotAcquired: errors.New("test: held")}, f)
			defer k.Close(nil)
			h := k.NewHold(context.Background(), "late", 1, time.Now().Add(-3*s.Lease/2), 0)
			if err := k.Add(h); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			renewed := f.renewed[h]
			f.mu.Unlock()
			if renewed != 1 {
				t.Fatalf("%d renewals before Add returned, want 1", renewed)
			}
			if fail == nil {
				if err := h.Err(); err != nil || !h.ValidUntil().After(time.Now()) {
					t.Fatalf("after Add: err %v, valid until %v; want held and valid", err, h.ValidUntil())
				}
				return
			}
			<-h.Lost()
			f.mu.Lock()
			loss := f.losses[h]
			f.mu.Unlock()
			if loss == nil || loss.Cause != Expired || !errors.Is(loss.Last, fail) || !strings.Contains(loss.Last.Error(), "the acquiring call was answered 1.5") {
				t.Fatalf("loss %+v, want an expiry saying the acquiring call was answered late", loss)
			}
		})
	}
}
