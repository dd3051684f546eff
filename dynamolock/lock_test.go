package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// Bad settings are refused before any I/O, naming the argument.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	api := &counting{} // no server behind: nothing may be called
	for _, tc := range []struct {
		name string
		opts []dynamolock.Option
		want string
	}{
		{"heartbeat above half the lease", []dynamolock.Option{dynamolock.WithLease(time.Second), dynamolock.WithHeartbeat(600 * time.Millisecond)}, "heartbeat"},
		{"negative heartbeat", []dynamolock.Option{dynamolock.WithHeartbeat(-time.Second)}, "heartbeat"},
		{"zero lease", []dynamolock.Option{dynamolock.WithLease(0)}, "lease"},
		{"lease above a day", []dynamolock.Option{dynamolock.WithLease(25 * time.Hour)}, "lease"},
		{"poll above the lease", []dynamolock.Option{dynamolock.WithLease(time.Second), dynamolock.WithPoll(2 * time.Second)}, "poll"},
		{"warning too wide", []dynamolock.Option{dynamolock.WithLease(time.Second), dynamolock.WithExpiryWarning(800 * time.Millisecond)}, "expiry warning"},
		{"empty partition key attribute", []dynamolock.Option{dynamolock.WithKeyAttributes("", "")}, "partition key attribute"},
		{"sort key attribute equals partition key attribute", []dynamolock.Option{dynamolock.WithKeyAttributes("key", "key")}, "sort key attribute"},
		{"key attribute clashes with an attribute", []dynamolock.Option{dynamolock.WithKeyAttributes(dynamolock.RVNAttr, "")}, "one of the item's own attributes"},
		{"nil clock", []dynamolock.Option{dynamolock.WithClock(nil)}, "clock"},
		{"zero heartbeat", []dynamolock.Option{dynamolock.WithHeartbeat(0)}, "heartbeat"},
		{"zero poll", []dynamolock.Option{dynamolock.WithPoll(0)}, "poll"},
		{"negative poll", []dynamolock.Option{dynamolock.WithPoll(-time.Second)}, "poll"},
		{"warning of -1ns", []dynamolock.Option{dynamolock.WithExpiryWarning(-1)}, "expiry warning"},
		{"warning of -2ns", []dynamolock.Option{dynamolock.WithExpiryWarning(-2)}, "expiry warning"},
		{"owner not UTF-8", []dynamolock.Option{dynamolock.WithOwner("me-\xff")}, "owner"},
		{"key name not UTF-8", []dynamolock.Option{dynamolock.WithKeyAttributes("k\xff", "")}, "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dynamolock.New(api, "locks", tc.opts...)
			if !errors.Is(err, dynamolock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if _, err := dynamolock.New(nil, "locks"); !errors.Is(err, dynamolock.ErrInvalid) {
		t.Fatalf("nil client: %v", err)
	}
	if _, err := dynamolock.New(api, ""); !errors.Is(err, dynamolock.ErrInvalid) {
		t.Fatalf("empty table: %v", err)
	}
	c, err := dynamolock.New(api, "locks", dynamolock.WithLease(time.Second), dynamolock.WithHeartbeat(500*time.Millisecond))
	if err != nil {
		t.Fatalf("heartbeat of exactly half the lease: %v", err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name string
		key  string
		opts []dynamolock.AcquireOption
		want string
	}{
		{"empty key", "", nil, "key is empty"},
		{"long key", strings.Repeat("k", dynamolock.MaxKeyLen+1), nil, "key is"},
		{"sort key without sort key name", "k", []dynamolock.AcquireOption{dynamolock.WithSortKey("s")}, "sort key"},
		{"negative wait", "k", []dynamolock.AcquireOption{dynamolock.WithWait(-time.Second)}, "wait"},
		{"negative max hold", "k", []dynamolock.AcquireOption{dynamolock.WithMaxHold(-time.Second)}, "max hold"},
		{"large data", "k", []dynamolock.AcquireOption{dynamolock.WithData(make([]byte, dynamolock.MaxDataLen+1))}, "data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.TryAcquire(context.Background(), tc.key, tc.opts...)
			if !errors.Is(err, dynamolock.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := api.total(); n != 0 {
		t.Fatalf("%d calls reached DynamoDB; validation must come before any I/O", n)
	}
}

// The item is laid out with the Java client's attribute names; the token
// grows with every acquisition, never with a heartbeat, and survives
// release; Lost and Err report a release.
func TestAcquireReleaseItemAndToken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	c := newClient(t, api, table, dynamolock.WithOwner("worker-1"), dynamolock.WithHeartbeat(testLease/8))

	l := mustAcquire(t, c, "job", dynamolock.WithData([]byte("payload")))
	if l.Token() != 1 || string(l.Data()) != "payload" || l.Key() != "job" {
		t.Fatalf("token %d, data %q, key %q; want 1, payload, job", l.Token(), l.Data(), l.Key())
	}
	item := readItem(t, api, table, "job")
	rvn := attrS(item, dynamolock.RVNAttr)
	if attrS(item, dynamolock.OwnerAttr) != "worker-1" || rvn == "" || attrS(item, dynamolock.LeaseAttr) != strconv.Itoa(int(testLease.Milliseconds())) ||
		attrN(item, dynamolock.TokenAttr) != "1" || item[dynamolock.ReleasedAttr] != nil {
		t.Fatalf("held item %v", item)
	}
	if b, ok := item[dynamolock.DataAttr].(*types.AttributeValueMemberB); !ok || string(b.Value) != "payload" {
		t.Fatalf("data attribute %v", item[dynamolock.DataAttr])
	}
	testenv.Until(t, "a heartbeat wrote a new record version", func() (bool, error) {
		item = readItem(t, api, table, "job")
		return attrS(item, dynamolock.RVNAttr) != rvn, nil
	})
	if attrN(item, dynamolock.TokenAttr) != "1" {
		t.Fatalf("after a heartbeat: token %s; want 1", attrN(item, dynamolock.TokenAttr))
	}
	if closed(l.Lost()) || l.Err() != nil || l.Context().Err() != nil {
		t.Fatal("a held lock reports an end")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(l.Lost()) || !errors.Is(l.Err(), dynamolock.ErrReleased) || !errors.Is(context.Cause(l.Context()), dynamolock.ErrReleased) {
		t.Fatalf("after release: lost %v, err %v", closed(l.Lost()), l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	item = readItem(t, api, table, "job")
	if attrS(item, dynamolock.ReleasedAttr) != "1" || attrN(item, dynamolock.TokenAttr) != "1" {
		t.Fatalf("released item %v; want isReleased 1 and the token kept", item)
	}
	for want := int64(2); want <= 4; want++ {
		l := mustAcquire(t, c, "job")
		if l.Token() != want {
			t.Fatalf("token %d, want %d", l.Token(), want)
		}
		if item := readItem(t, api, table, "job"); item[dynamolock.DataAttr] != nil {
			t.Fatalf("an acquisition without data left the old payload: %v", item[dynamolock.DataAttr])
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The Lock's Context carries the values of the context it was acquired
// with (a trace ID), but not its deadline or cancellation: cancelling that
// context after Acquire returns leaves the lock and its Context alone, the
// heartbeats go on, and only the lock's end cancels the Context.
func TestLockContextCarriesValues(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/8))
	type traceKey struct{}
	for _, tc := range []struct {
		name    string
		acquire func(ctx context.Context, key string) (*dynamolock.Lock, error)
	}{
		{"Acquire", func(ctx context.Context, key string) (*dynamolock.Lock, error) { return c.Acquire(ctx, key) }},
		{"TryAcquire", func(ctx context.Context, key string) (*dynamolock.Lock, error) { return c.TryAcquire(ctx, key) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := context.WithValue(context.Background(), traceKey{}, "trace-1")
			ctx, cancel := context.WithTimeout(base, testenv.Scale(30*time.Second))
			defer cancel()
			l, err := tc.acquire(ctx, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if got := l.Context().Value(traceKey{}); got != "trace-1" {
				t.Fatalf("Lock.Context().Value = %v; want the acquiring context's trace-1", got)
			}
			if _, ok := l.Context().Deadline(); ok {
				t.Fatal("Lock.Context has the acquiring context's deadline")
			}
			cancel() // propagates to children synchronously
			if err := l.Context().Err(); err != nil {
				t.Fatalf("cancelling the acquiring context cancelled Lock.Context: %v", err)
			}
			rvn := attrS(readItem(t, api, table, tc.name), dynamolock.RVNAttr)
			testenv.Until(t, "a heartbeat after the acquiring context ended", func() (bool, error) {
				return attrS(readItem(t, api, table, tc.name), dynamolock.RVNAttr) != rvn, nil
			})
			if l.Err() != nil || l.Context().Err() != nil {
				t.Fatalf("lock ended with its acquiring context: %v, %v", l.Err(), l.Context().Err())
			}
			if err := l.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(context.Cause(l.Context()), dynamolock.ErrReleased) || l.Context().Value(traceKey{}) != "trace-1" {
				t.Fatalf("after Release: cause %v, value %v", context.Cause(l.Context()), l.Context().Value(traceKey{}))
			}
		})
	}
}

// An uncontended acquire and release is two calls (two conditional writes,
// no read), and holding a lock costs one call per heartbeat period: the
// k-th confirmed heartbeat is sent no earlier than k periods after the
// acquisition, less the half period by which the first one may come early
// (spread, so that locks acquired together do not heartbeat together; the
// ceiling, measured on the test's own clock), heartbeats
// keep coming (the floor: ten of them, however slow the machine), and
// none needs a read. A write that times out is retried, so the only
// failed calls allowed are timeouts, and they are reported. A held lock
// that expires before its ten heartbeats, one unanswered within the lease
// (a server too busy), makes that trial inconclusive (testenv.Conclusive):
// another runs on a key of its own.
func TestCallsPerPairAndHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	api := &counting{DynamoDBAPI: server}
	hb := testLease / 16
	c := newClient(t, api, table, dynamolock.WithHeartbeat(hb))
	// ceiling returns how many confirmed heartbeats writes allow, and fails
	// the test if the k-th was sent less than k periods (less a half)
	// after start.
	ceiling := func(writes []write, start time.Time) int {
		k := 0
		for _, w := range writes {
			if w.err != nil {
				continue
			}
			k++
			if since := w.sent.Sub(start); since < time.Duration(k)*hb-hb/2 {
				t.Fatalf("confirmed heartbeat %d of %s sent %v after the acquisition began; want at least %d periods of %v, less half a period", k, w.key, since, k, hb)
			}
		}
		return k
	}
	const pairs = 20
	pairBeats := 0
	for i := 0; i < pairs; i++ {
		key := "k" + strconv.Itoa(i%3) // absent at first, then released
		start := time.Now()
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var beats []write
		for _, w := range api.recorded("heartbeat") {
			if w.key == key && !w.sent.Before(start) {
				beats = append(beats, w)
			}
		}
		pairBeats += ceiling(beats, start) // a pair slower than a period (a busy machine) heartbeats
	}
	timeouts := 0
	for _, w := range append(api.recorded("acquire"), api.recorded("release")...) {
		if w.err != nil {
			if !errors.Is(w.err, context.DeadlineExceeded) {
				t.Fatalf("%s of %s failed: %v", w.op, w.key, w.err)
			}
			timeouts++
		}
	}
	if a, r, g, d := api.succeeded("acquire"), api.succeeded("release"), api.gets.Load(), api.deletes.Load(); a != pairs || r != pairs || g > int64(timeouts) || d != 0 {
		t.Fatalf("%d pairs cost %d acquiring and %d releasing writes, %d gets, %d deletes (%d writes timed out); want %d and %d, no delete, and no read but after a timeout",
			pairs, a, r, g, d, timeouts, pairs, pairs)
	}

	var beats []write
	var start time.Time
	var held time.Duration
	testenv.Conclusive(t, func(trial int) error {
		key := "held" + strconv.Itoa(trial)
		start = time.Now()
		l := mustAcquire(t, c, key)
		testenv.Until(t, "ten heartbeats confirmed (or the lock's end)", func() (bool, error) {
			beats = beats[:0]
			for _, w := range api.recorded("heartbeat") {
				if w.key == key {
					beats = append(beats, w)
				}
			}
			return closed(l.Lost()) || ceiling(beats, start) >= 10, nil
		})
		if err := l.Err(); unanswered(err) {
			return fmt.Errorf("lock %q lost after %d confirmed heartbeats: %w", key, ceiling(beats, start), err)
		} else if err != nil {
			t.Fatalf("lock %q lost: %v", key, err)
		}
		held = time.Since(start)
		// Its ten heartbeats counted, the lock may still expire the same
		// way before the release.
		if err := l.Release(ctx); err != nil && !unanswered(err) {
			t.Fatal(err)
		}
		return nil
	})
	if g := api.gets.Load(); g > int64(timeouts) {
		t.Fatalf("holding cost %d reads; want none", g)
	}
	t.Logf("%d pairs: %d calls (%d heartbeats, %d timeouts); held %v: %d heartbeat calls, %d confirmed (at most %d periods)",
		pairs, 2*pairs+pairBeats+timeouts, pairBeats, timeouts, held.Round(time.Millisecond), len(beats), ceiling(beats, start), held/hb)
}

// TryAcquire on a held lock says who holds it, and changes nothing. A
// holder whose lock expires during the waiter's tries, a heartbeat
// unanswered within the lease (a server too busy), makes the trial
// inconclusive (testenv.Conclusive): another runs on a key of its own.
// The waiter taking a lock that did not expire so fails the test.
func TestTryAcquireHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	a := newClient(t, api, table, dynamolock.WithOwner("a"))
	b := newClient(t, api, table, dynamolock.WithOwner("b"))
	testenv.Conclusive(t, func(trial int) error {
		key := "k" + strconv.Itoa(trial)
		l := mustAcquire(t, a, key, dynamolock.WithData([]byte("a's data")))
		_, err := b.TryAcquire(ctx, key)
		var held *dynamolock.HeldError
		if !errors.As(err, &held) || !errors.Is(err, dynamolock.ErrNotAcquired) || held.Owner != "a" || string(held.Data) != "a's data" || held.Token != l.Token() {
			t.Fatalf("err = %v (%+v); want a HeldError naming a", err, held)
		}
		// Acquire with a wait limit gives up the same way, after the limit.
		start := time.Now()
		w, err := b.Acquire(ctx, key, dynamolock.WithWait(150*time.Millisecond))
		if err == nil {
			w.Close()
			// The holder's expiry came first, on its own clock: its
			// goroutine may just not have run yet.
			if waitClosed(l.Lost(), testLease) && unanswered(l.Err()) {
				l.Close()
				return fmt.Errorf("the holder's lock expired during the wait and the waiter took it: %w", l.Err())
			}
			t.Fatalf("the waiter took the lock from its holder (holder's lock: %v)", l.Err())
		}
		if !errors.As(err, &held) || time.Since(start) < 150*time.Millisecond {
			t.Fatalf("Acquire with a wait of 150ms: %v after %v", err, time.Since(start))
		}
		if closed(l.Lost()) {
			if err := l.Err(); unanswered(err) {
				l.Close()
				return fmt.Errorf("the holder's lock expired during the wait: %w", err)
			}
			t.Fatalf("the holder lost its lock to a waiter: %v", l.Err())
		}
		l.Close()
		l2, err := b.TryAcquire(ctx, key)
		if err != nil || l2.Token() != 2 {
			t.Fatalf("TryAcquire of a released lock: %v", err)
		}
		l2.Close()
		return nil
	})
}

// A live holder is never displaced, however long others wait; a dead one
// (its heartbeats stopped: every call it makes fails) is taken over by
// TryAcquire once this client has seen the same version for a full lease,
// and not before. The waiter tries both locks side by side, for more than
// a lease. A live holder whose lock expires, a heartbeat unanswered
// within the lease (a server too busy), is no longer live: the trial is
// inconclusive (testenv.Conclusive), and another runs on keys and a dead
// holder of its own.
func TestTryAcquireTakesOverDeadHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	liveHolder := newClient(t, server, table, dynamolock.WithHeartbeat(testLease/8))
	waiter := newClient(t, server, table)
	testenv.Conclusive(t, func(trial int) error {
		deadAPI := &faulty{DynamoDBAPI: server}
		deadHolder := newClient(t, deadAPI, table, dynamolock.WithHeartbeat(testLease/8))
		t.Cleanup(func() { deadAPI.blackhole.Store(false) }) // before deadHolder's Close
		liveKey, deadKey := "live"+strconv.Itoa(trial), "dead"+strconv.Itoa(trial)

		live := mustAcquire(t, liveHolder, liveKey)
		dead := mustAcquire(t, deadHolder, deadKey)
		deadAPI.blackhole.Store(true) // the holder is cut off: no heartbeat lands
		begin := time.Now()
		var got *dynamolock.Lock
		var took time.Duration
		// expired ends a trial whose live holder's lock expired with a
		// heartbeat unanswered; any other loss fails the test.
		expired := func(what string) error {
			if !unanswered(live.Err()) {
				t.Fatalf("%s (live holder's lock: %v)", what, live.Err())
			}
			if got != nil {
				got.Close()
			}
			live.Close()
			return fmt.Errorf("%s: %w", what, live.Err())
		}
		for got == nil || time.Since(begin) < testLease+testLease/4 {
			if l, err := waiter.TryAcquire(ctx, liveKey); !errors.Is(err, dynamolock.ErrNotAcquired) {
				if l != nil {
					l.Close()
				}
				if err == nil {
					// The holder's expiry came first, on its own clock:
					// its goroutine may just not have run yet.
					waitClosed(live.Lost(), testLease)
					return expired("the waiter took the live holder's lock")
				}
				t.Fatalf("TryAcquire of a live holder's lock: %v", err)
			}
			if got == nil {
				l, err := waiter.TryAcquire(ctx, deadKey)
				switch {
				case err == nil:
					got, took = l, time.Since(begin)
				case !errors.Is(err, dynamolock.ErrNotAcquired):
					t.Fatal(err)
				case time.Since(begin) > 3*testLease:
					t.Fatal("the dead holder's lock was never taken over")
				}
			}
			time.Sleep(testPoll) // the period of a caller that retries TryAcquire
		}
		if closed(live.Lost()) {
			return expired("live holder lost its lock")
		}
		// The waiter's first sighting came after begin, and the takeover a
		// lease (the holder's, stored on the item) after that.
		if took < testLease || got.Token() != dead.Token()+1 {
			t.Fatalf("taken over after %v with token %d; want at least a lease (%v) and token %d", took, got.Token(), testLease, dead.Token()+1)
		}
		if !waitClosed(dead.Lost(), 2*testLease) {
			t.Fatal("the cut-off holder never learned of its loss")
		}
		var lost *dynamolock.LostError
		if !errors.As(dead.Err(), &lost) || lost.Cause != dynamolock.Expired || !errors.Is(dead.Err(), errInjected) {
			t.Fatalf("cut-off holder's error %v; want Expired with the last DynamoDB error", dead.Err())
		}
		t.Logf("dead holder's lock taken over %v after the cut (lease %v)", took.Round(time.Millisecond), testLease)
		got.Close()
		live.Close()
		return nil
	})
}

// Only the waiter's own elapsed time counts: with an injected clock, a dead
// holder's lock is taken over as soon as that clock has advanced a lease,
// and not while it has not (however much real time passes below a lease).
func TestTakeoverUsesOwnClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	holderAPI := &faulty{DynamoDBAPI: server}
	holder := newClient(t, holderAPI, table, dynamolock.WithLease(time.Hour), dynamolock.WithPoll(time.Second))
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	waiter := newClient(t, server, table, dynamolock.WithClock(clock))

	dead := mustAcquire(t, holder, "k")
	holderAPI.blackhole.Store(true)
	t.Cleanup(func() { holderAPI.blackhole.Store(false) }) // before holder's Close
	for i := 0; i < 3; i++ {
		if _, err := waiter.TryAcquire(ctx, "k"); !errors.Is(err, dynamolock.ErrNotAcquired) {
			t.Fatalf("before the waiter's clock advanced a lease: %v", err)
		}
	}
	offset.Store(int64(time.Hour)) // the holder's lease, as stored on the item
	l, err := waiter.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("after the waiter's clock advanced a lease: %v", err)
	}
	// dead's token + 1, or more if the takeover's answer came after a
	// lease (a busy server): the waiter then wrote again.
	if l.Token() <= dead.Token() {
		t.Fatalf("took over with token %d; want above the dead holder's %d", l.Token(), dead.Token())
	}
	l.Close()
}

// Many goroutines on several clients contend for one key: never two inside
// at once, and tokens strictly grow in the order of entry. The control runs
// the same workload without the lock and must see overlaps, proving the
// counter can catch them.
func TestMutualExclusionGoroutines(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	const clients, perClient, rounds = 4, 3, 6
	cs := make([]*dynamolock.Client, clients)
	for i := range cs {
		cs[i] = newClient(t, api, table)
	}
	var inside, overlaps, regressions, entries, lastToken, losses, unconfirmed atomic.Int64
	enter := func(token int64) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		entries.Add(1)
		if token != 0 && lastToken.Swap(token) >= token {
			regressions.Add(1)
		}
		time.Sleep(time.Duration(1+entries.Load()%3) * time.Millisecond)
		inside.Add(-1)
	}
	t.Run("control without the lock", func(t *testing.T) {
		done := make(chan struct{})
		for g := 0; g < clients*perClient; g++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for r := 0; r < rounds; r++ {
					enter(0)
				}
			}()
		}
		for g := 0; g < clients*perClient; g++ {
			<-done
		}
		if overlaps.Load() == 0 {
			t.Fatal("no overlap counted without a lock: the counter cannot fail")
		}
		t.Logf("without the lock: %d overlaps in %d entries", overlaps.Load(), entries.Load())
	})
	overlaps.Store(0)
	entries.Store(0)
	errs := make(chan error, clients*perClient)
	for g := 0; g < clients*perClient; g++ {
		go func() {
			var err error
			defer func() { errs <- err }()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
				var l *dynamolock.Lock
				l, err = cs[g%clients].Acquire(ctx, "hot")
				cancel()
				if err != nil {
					return
				}
				enter(l.Token())
				if err = l.Close(); errors.Is(err, dynamolock.ErrLockLost) {
					losses.Add(1) // its heartbeats starved past the lease
					err = nil
				} else if errors.Is(err, context.DeadlineExceeded) {
					unconfirmed.Add(1) // the item stays held until its lease runs out
					err = nil
				} else if err != nil {
					return
				}
			}
		}()
	}
	for g := 0; g < clients*perClient; g++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	// A holder whose lease lapsed (a machine too busy for its heartbeats)
	// learns it from Close; only such a holder may have overlapped the next,
	// or entered after it (starved between Acquire and its entry).
	if o, r, e, l := overlaps.Load(), regressions.Load(), entries.Load(), losses.Load(); o > l || r > l || e != clients*perClient*rounds {
		t.Fatalf("%d overlaps, %d token regressions, %d entries, %d leases lost; want at most one overlap and one regression per lost lease, %d entries", o, r, e, l, clients*perClient*rounds)
	}
	t.Logf("%d goroutines on %d clients: %d entries, %d overlaps, %d leases lost, %d releases unconfirmed, last token %d", clients*perClient, clients, entries.Load(), overlaps.Load(), losses.Load(), unconfirmed.Load(), lastToken.Load())
}

// Locks on one partition key with different sort keys are independent.
func TestSortKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api := testenv.DynamoDB(t)
	table := testenv.Table(t, api, true)
	c := newClient(t, api, table, dynamolock.WithKeyAttributes("pk", "sk"))
	if _, err := c.TryAcquire(ctx, "k"); !errors.Is(err, dynamolock.ErrInvalid) {
		t.Fatalf("no sort key value: %v", err)
	}
	a := mustAcquire(t, c, "k", dynamolock.WithSortKey("a"))
	b, err := c.TryAcquire(ctx, "k", dynamolock.WithSortKey("b"))
	if err != nil || a.Token() != 1 || b.Token() != 1 || b.SortKey() != "b" {
		t.Fatalf("second sort key: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "k", dynamolock.WithSortKey("a")); !errors.Is(err, dynamolock.ErrNotAcquired) {
		t.Fatalf("same sort key: %v", err)
	}
	a.Close()
	b.Close()
}

// Without fencing, release deletes the item (the Java client's default),
// the token is 0 and ConditionCheck refuses.
func TestWithoutFencing(t *testing.T) {
	t.Parallel()
	api, table := newTable(t)
	c := newClient(t, api, table, dynamolock.WithoutFencing())
	l := mustAcquire(t, c, "k")
	if l.Token() != 0 {
		t.Fatalf("token %d without fencing", l.Token())
	}
	if _, err := l.ConditionCheck(); !errors.Is(err, dynamolock.ErrInvalid) {
		t.Fatalf("ConditionCheck: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if item := readItem(t, api, table, "k"); item != nil {
		t.Fatalf("item after release without fencing: %v", item)
	}
}

// The maximum hold ends a lock whose heartbeats would otherwise go on
// forever: the warning, then Lost with Cause MaxHold, and the item is
// released so the next holder need not wait a lease.
func TestMaxHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api, table := newTable(t)
	const maxHold, warning = 300 * time.Millisecond, 100 * time.Millisecond
	c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/8), dynamolock.WithExpiryWarning(warning))
	start := time.Now()
	l := mustAcquire(t, c, "k", dynamolock.WithMaxHold(maxHold))
	warnedFirst := make(chan bool, 1)
	go func() { <-l.Lost(); warnedFirst <- closed(l.Expiring()) }()
	if !waitClosed(l.Expiring(), maxHold+testLease) {
		t.Fatal("no warning before the maximum hold")
	}
	warned := time.Since(start)
	if !waitClosed(l.Lost(), maxHold+testLease) {
		t.Fatal("the maximum hold did not end the lock")
	}
	ended := time.Since(start)
	if !<-warnedFirst {
		t.Fatal("Lost closed before Expiring")
	}
	var lost *dynamolock.LostError
	if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.MaxHold {
		t.Fatalf("err %v; want MaxHold", l.Err())
	}
	// The hold counts from the acquiring write's send, after start: neither
	// the warning nor the end can come early; on a busy machine they may
	// come late, but within a lease.
	if warned < maxHold-warning || ended < maxHold || ended > maxHold+testLease {
		t.Fatalf("warned after %v, ended after %v; want the warning from %v and the end from %v", warned, ended, maxHold-warning, maxHold)
	}
	if err := l.Release(ctx); !errors.As(err, &lost) {
		t.Fatalf("Release after the maximum hold: %v", err)
	}
	l2, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("the item was not released at the maximum hold: %v", err)
	}
	l2.Close()
}

// Close releases every lock, makes a blocked Acquire return ErrClosed, and
// returns only when the Client's goroutines have ended.
func TestCloseReleasesAndWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	api := &counting{DynamoDBAPI: server}
	// Close gives each release a lease: a long one, so that a server slowed
	// by a busy machine still answers within it.
	a, err := dynamolock.New(api, table, dynamolock.WithKeyAttributes("pk", ""), dynamolock.WithLease(4*testLease))
	if err != nil {
		t.Fatal(err)
	}
	b := newClient(t, server, table)
	l1, l2 := mustAcquire(t, a, "k1"), mustAcquire(t, a, "k2")
	lb := mustAcquire(t, b, "k3-held-by-b")
	defer lb.Close()
	blocked := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, "k3-held-by-b")
		blocked <- err
	}()
	testenv.Until(t, "the Acquire found the lock held", func() (bool, error) {
		for _, w := range api.recorded("acquire") {
			var ccf *types.ConditionalCheckFailedException
			if w.key == "k3-held-by-b" && errors.As(w.err, &ccf) {
				return true, nil
			}
		}
		return false, nil
	})
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select { // Close waited for it (goleak checks no goroutine is left)
	case err := <-blocked:
		if !errors.Is(err, dynamolock.ErrClosed) {
			t.Fatalf("blocked Acquire returned %v; want ErrClosed", err)
		}
	case <-time.After(testenv.Scale(5 * time.Second)):
		t.Fatal("a blocked Acquire did not return after Close")
	}
	for _, l := range []*dynamolock.Lock{l1, l2} {
		if !closed(l.Lost()) || !errors.Is(l.Err(), dynamolock.ErrReleased) {
			t.Fatalf("lock %s after Close: %v", l.Key(), l.Err())
		}
		if attrS(readItem(t, server, table, l.Key()), dynamolock.ReleasedAttr) != "1" {
			t.Fatalf("lock %s not released by Close", l.Key())
		}
	}
	if _, err := a.TryAcquire(ctx, "k1"); !errors.Is(err, dynamolock.ErrClosed) {
		t.Fatalf("TryAcquire after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
