package lease_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/pgoutcome"
)

// Acquire and release, twice: the second holder gets the next token, the
// row stays (released) after each release.
func TestAcquireRelease(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	c := newClient(t, pool)
	l := mustAcquire(t, c, "job", lease.WithData([]byte("v1")))
	if l.Token() != 1 || l.Key() != "job" || string(l.Data()) != "v1" || l.Err() != nil {
		t.Fatalf("first lock: token %d key %q data %q err %v", l.Token(), l.Key(), l.Data(), l.Err())
	}
	var nilCtx context.Context
	if err := l.Release(nilCtx); !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "ctx is nil") {
		t.Fatalf("Release(nil): %v; want ErrInvalid naming ctx", err)
	}
	if l.Err() != nil || closed(l.Lost()) {
		t.Fatalf("after a refused Release(nil): err %v, lost %v; want the lock still held", l.Err(), closed(l.Lost()))
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !closed(l.Lost()) || !errors.Is(l.Err(), lease.ErrReleased) || closed(l.Expiring()) {
		t.Fatalf("after release: lost %v err %v expiring %v", closed(l.Lost()), l.Err(), closed(l.Expiring()))
	}
	if r := readRow(t, pool, "job"); !r.Released || r.Token != 1 {
		t.Fatalf("row after release: %+v", r)
	}
	l2 := mustAcquire(t, c, "job")
	defer l2.Close()
	if l2.Token() != 2 {
		t.Fatalf("second token %d, want 2", l2.Token())
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("second Release of the first lock: %v", err)
	}
	if r := readRow(t, pool, "job"); r.Released || r.Token != 2 {
		t.Fatalf("first lock's second Release touched the row: %+v", r)
	}
}

// A held lock: TryAcquire reports the holder at once; a bounded Acquire
// gives up after its wait; both change nothing. A live holder keeps its
// lock through many leases of renewals. A holder whose lock expires, a
// renewal unanswered within the lease (a server too busy), is no longer
// live: the trial is inconclusive (testenv.Conclusive), and another runs
// on a key of its own; the waiter taking a lock that did not expire so
// fails the test.
func TestHeld(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	a := newClient(t, pool, lease.WithOwner("a"))
	b := newClient(t, pool, lease.WithOwner("b"))
	testenv.Conclusive(t, func(trial int) error {
		key := "k" + strconv.Itoa(trial)
		l := mustAcquire(t, a, key, lease.WithData([]byte("payload")))
		defer l.Close()
		_, err := b.TryAcquire(context.Background(), key)
		var held *lease.HeldError
		if !errors.As(err, &held) || !errors.Is(err, lease.ErrNotAcquired) || held.Owner != "a" || held.Token != 1 || !bytes.Equal(held.Data, []byte("payload")) {
			t.Fatalf("TryAcquire of a held lock: %v (%+v)", err, held)
		}
		start := time.Now()
		w, err := b.Acquire(context.Background(), key, lease.WithWait(3*testLease))
		if err == nil {
			w.Close()
			// The holder's lease ran out first: its goroutine may just
			// not have run yet.
			testenv.Until(t, "the holder's lock ended after the waiter took it", func() (bool, error) { return closed(l.Lost()), nil })
			if err := l.Err(); unanswered(err) {
				return fmt.Errorf("the holder's lock expired during the wait and the waiter took it: %w", err)
			}
			t.Fatalf("the waiter took the lock from its holder (holder's lock: %v)", l.Err())
		}
		// Not acquired; or, on a busy machine, the wait ran out with a try in
		// flight, whose outcome the caller is told it does not know.
		if !errors.Is(err, lease.ErrNotAcquired) && !errors.Is(err, pgoutcome.ErrStoppedWaiting) || time.Since(start) < 3*testLease {
			t.Fatalf("bounded Acquire: %v after %v", err, time.Since(start))
		}
		if err := l.Err(); unanswered(err) {
			return fmt.Errorf("the holder's lock expired during the wait: %w", err)
		}
		if l.Err() != nil || readRow(t, pool, key).Token != 1 {
			t.Fatalf("holder lost its lock to waiters: %v", l.Err())
		}
		return nil
	})
}

// Waiters contend: every acquisition gets a distinct token, and no two
// holders overlap by their own belief.
func TestContention(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	const workers, rounds = 4, 5
	clients := make([]*lease.Client, workers)
	for i := range clients {
		clients[i] = newClient(t, pool)
	}
	var holding, overlaps atomic.Int32
	tokens := make(chan int64, workers*rounds)
	testenv.RunTrials(t, workers*rounds, workers, func(w, i int) {
		l := mustAcquire(t, clients[w], "hot")
		if holding.Add(1) > 1 {
			overlaps.Add(1)
		}
		tokens <- l.Token()
		time.Sleep(time.Millisecond)
		holding.Add(-1)
		if err := l.Release(context.Background()); err != nil {
			t.Error(err)
		}
	})
	close(tokens)
	seen := map[int64]bool{}
	for tok := range tokens {
		if seen[tok] {
			t.Fatalf("token %d handed out twice", tok)
		}
		seen[tok] = true
	}
	if len(seen) != workers*rounds || overlaps.Load() != 0 {
		t.Fatalf("%d distinct tokens of %d, %d overlaps", len(seen), workers*rounds, overlaps.Load())
	}
}

// An uncontended acquire + release is two statements; a waiter tries with
// one acquiring statement per poll and nothing else.
func TestStatementCount(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	db := newFaultDB(pool)
	c := newClient(t, db, lease.WithLease(testenv.Scale(time.Minute)))
	before := db.total()
	l := mustAcquire(t, c, "k")
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := db.total() - before; n != 2 || db.count("acquire") != 1 || db.count("release") != 1 {
		t.Fatalf("acquire + release took %d statements (%v), want 2", n, db.counts)
	}

	holder := newClient(t, pool)
	h := mustAcquire(t, holder, "w")
	wdb := newFaultDB(pool)
	waiter := newClient(t, wdb, lease.WithPoll(testPoll))
	schema := wdb.total() // CreateSchema's
	done := make(chan error, 1)
	go func() {
		l, err := waiter.Acquire(context.Background(), "w")
		if err == nil {
			err = l.Close()
		}
		done <- err
	}()
	testenv.Until(t, "the waiter has tried 5 times", func() (bool, error) { return wdb.count("acquire") >= 5, nil })
	h.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if wdb.total()-schema != wdb.count("acquire")+wdb.count("release") || wdb.count("release") != 1 {
		t.Fatalf("waiter statements: %v; want only acquiring ones, and its release", wdb.counts)
	}
}

// The release's asynchronous commit is its own: the session it ran on
// commits synchronously again afterwards.
func TestReleaseLeavesTheSessionAsItWas(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 1) // one connection: the release's
	show := func() string {
		t.Helper()
		var setting string
		if err := pool.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&setting); err != nil {
			t.Fatal(err)
		}
		return setting
	}
	before := show()
	c := newClient(t, pool)
	l := mustAcquire(t, c, "k")
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := show(); after != before || before == "off" {
		t.Fatalf("synchronous_commit %q before a release, %q after; want the same, not off", before, after)
	}
}

// A holder whose renewals cannot reach the database believes it holds the
// lock for less than the database does: its local validity, and the
// acquirer's lock-delay after it, end before anyone else takes the lock,
// however late its goroutines run on a loaded machine. It then learns of its loss
// (Expiring, then Lost, Cause Expired); the next holder's token is higher.
func TestExpiryBeforeTakeover(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	db := newFaultDB(pool)
	delay := testLease / 2
	a := newClient(t, db)
	b := newClient(t, pool, lease.WithLockDelay(delay)) // the acquirer's delay applies
	l := mustAcquire(t, a, "k")
	db.set(func(f *faultDB) { f.block["renew"] = true })
	var took *lease.Lock
	var tookBy time.Time // b's acquisition committed before this
	testenv.Until(t, "b takes the lock", func() (bool, error) {
		nl, err := b.TryAcquire(context.Background(), "k")
		if err == nil {
			took, tookBy = nl, time.Now()
			return true, nil
		}
		return false, ignoreHeld(err)
	})
	defer took.Close()
	if end := l.ValidUntil().Add(delay); end.After(tookBy) {
		t.Fatalf("b took the lock %v before a's validity and lock-delay ended", end.Sub(tookBy))
	}
	testenv.Until(t, "a learns of its loss", func() (bool, error) { return closed(l.Lost()), nil })
	if !closed(l.Expiring()) {
		t.Fatal("Lost closed for an expiry before Expiring")
	}
	var le *lease.LostError
	if !errors.As(l.Err(), &le) || le.Cause != lease.Expired {
		t.Fatalf("a's error: %v", l.Err())
	}
	if took.Token() <= l.Token() {
		t.Fatalf("b's token %d, a's %d", took.Token(), l.Token())
	}
	if err := l.Release(context.Background()); !errors.Is(err, lease.ErrLockLost) {
		t.Fatalf("a's Release after the takeover: %v", err)
	}
	if r := readRow(t, pool, "k"); r.Released || r.Token != took.Token() {
		t.Fatalf("a's Release touched b's row: %+v", r)
	}
}

func ignoreHeld(err error) error {
	if errors.Is(err, lease.ErrNotAcquired) {
		return nil
	}
	return err
}

// Lost answers: an acquisition whose answer was lost is found by the next
// try; renewals whose answers are lost keep the lock; a release whose
// answer was lost is confirmed by a read.
func TestLostAnswers(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	db := newFaultDB(pool)
	c := newClient(t, db)
	db.set(func(f *faultDB) { f.lose["acquire"] = 1 })
	l := mustAcquire(t, c, "k")
	if l.Token() != 1 || db.count("acquire") != 2 {
		t.Fatalf("token %d after %d acquiring statements; want 1 after 2", l.Token(), db.count("acquire"))
	}
	db.set(func(f *faultDB) { f.lose["renew"] = 1000 })
	n := db.count("renew")
	testenv.Until(t, "8 renewals", func() (bool, error) { return db.count("renew") >= n+8, nil })
	if l.Err() != nil || readRow(t, pool, "k").Token != 1 {
		t.Fatalf("lost renewal answers cost the lock: %v", l.Err())
	}
	db.set(func(f *faultDB) { f.lose["release"] = 1 })
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("release with a lost answer: %v", err)
	}
	if r := readRow(t, pool, "k"); !r.Released || r.Token != 1 {
		t.Fatalf("row after release: %+v", r)
	}
}

// The maximum hold ends a lock that renews fine: Expiring, then Lost with
// Cause MaxHold, and the row is released.
func TestMaxHold(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	c := newClient(t, pool)
	start := time.Now()
	l := mustAcquire(t, c, "k", lease.WithMaxHold(2*testLease))
	<-l.Lost()
	var le *lease.LostError
	if !errors.As(l.Err(), &le) || le.Cause != lease.MaxHold || !closed(l.Expiring()) || time.Since(start) < 2*testLease {
		t.Fatalf("after max hold: %v, expiring %v, after %v", l.Err(), closed(l.Expiring()), time.Since(start))
	}
	testenv.Until(t, "the row is released", func() (bool, error) { return readRow(t, pool, "k").Released, nil })
}

// Close releases what the Client holds and refuses later calls.
func TestClose(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	c := newClient(t, pool)
	l := mustAcquire(t, c, "k")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), lease.ErrReleased) || !readRow(t, pool, "k").Released {
		t.Fatalf("lock after Close: %v", l.Err())
	}
	if _, err := c.Acquire(context.Background(), "k"); !errors.Is(err, lease.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Bad input is refused before any I/O, naming the argument.
func TestInvalid(t *testing.T) {
	db := newFaultDB(nil)
	for _, tc := range []struct {
		name string
		opts []lease.Option
		want string
	}{
		{"zero lease", []lease.Option{lease.WithLease(0)}, "lease"},
		{"negative lease", []lease.Option{lease.WithLease(-time.Second)}, "lease"},
		{"heartbeat = lease", []lease.Option{lease.WithLease(time.Second), lease.WithHeartbeat(time.Second)}, "heartbeat"},
		{"heartbeat > half", []lease.Option{lease.WithLease(time.Second), lease.WithHeartbeat(600 * time.Millisecond)}, "heartbeat"},
		{"zero heartbeat", []lease.Option{lease.WithHeartbeat(0)}, "heartbeat"},
		{"negative lock-delay", []lease.Option{lease.WithLockDelay(-time.Second)}, "lock-delay"},
		{"zero poll", []lease.Option{lease.WithPoll(0)}, "poll"},
		{"warning too large", []lease.Option{lease.WithLease(time.Second), lease.WithExpiryWarning(time.Second)}, "expiry warning"},
		{"empty table", []lease.Option{lease.WithTable("")}, "table"},
		{"long table", []lease.Option{lease.WithTable(strings.Repeat("t", 64))}, "table"},
		{"NUL owner", []lease.Option{lease.WithOwner("a\x00b")}, "owner"},
		{"nil clock", []lease.Option{lease.WithClock(nil)}, "clock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lease.New(db, tc.opts...)
			if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v; want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if _, err := lease.New(nil); !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), "db") {
		t.Fatalf("New(nil): %v", err)
	}
	c, err := lease.New(db, lease.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name, key string
		opts      []lease.AcquireOption
		want      string
	}{
		{"empty key", "", nil, "key"},
		{"long key", strings.Repeat("k", lease.MaxKeyLen+1), nil, "key"},
		{"NUL key", "a\x00b", nil, "NUL"},
		{"bad UTF-8 key", "a\xffb", nil, "UTF-8"},
		{"zero wait", "k", []lease.AcquireOption{lease.WithWait(0)}, "wait"},
		{"negative wait", "k", []lease.AcquireOption{lease.WithWait(-time.Second)}, "wait"},
		{"zero max hold", "k", []lease.AcquireOption{lease.WithMaxHold(0)}, "max hold"},
		{"big data", "k", []lease.AcquireOption{lease.WithData(make([]byte, lease.MaxDataLen+1))}, "data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, acquire := range []func(context.Context, string, ...lease.AcquireOption) (*lease.Lock, error){c.Acquire, c.TryAcquire} {
				_, err := acquire(context.Background(), tc.key, tc.opts...)
				if !errors.Is(err, lease.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("acquire: %v; want ErrInvalid naming %q", err, tc.want)
				}
			}
		})
	}
	if n := db.total(); n != 0 {
		t.Fatalf("%d statements sent for bad input", n)
	}
}
