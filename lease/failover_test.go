package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// The primary dies under a held lease and its synchronous standby is
// promoted; the clients' multi-host DSN finds the new primary. Whatever
// the timing, there are never two holders by their own belief, and
// tokens only grow across failovers: every acquisition that was answered
// reached the standby before its answer, so the new primary never hands
// out a token already given.
func TestFailover(t *testing.T) {
	t.Parallel()
	pair := testenv.PostgresPair(t)
	pool := testenv.Pool(t, pair.DSNFor(pair.CreateSchema()), 8)
	d := testenv.Scale(2 * time.Second)
	a := newClient(t, pool, lease.WithLease(d))
	b := newClient(t, pool, lease.WithLease(d))
	const key = "leader"
	var top int64 // the highest token answered so far
	grew := func(round int, who string, token int64) {
		t.Helper()
		if token <= top {
			t.Fatalf("round %d: %s got token %d, not above %d: a token went backwards", round, who, token, top)
		}
		top = token
	}
	rounds := testenv.Trials(2, 10)
	for round := range rounds {
		l := mustAcquire(t, a, key)
		grew(round, "the holder", l.Token())
		pair.KillPrimary()
		pair.Promote()
		testenv.Until(t, "the new primary answers", func() (bool, error) { return pool.Ping(context.Background()) == nil, nil })
		nl, err := b.TryAcquire(context.Background(), key)
		switch {
		case err == nil:
			if !closed(l.Lost()) {
				t.Fatalf("round %d: rival took token %d while the holder (token %d) had not learnt its loss", round, nl.Token(), l.Token())
			}
			grew(round, "the rival", nl.Token())
			t.Logf("round %d: holder lost (%v); rival took token %d", round, l.Err(), nl.Token())
			if err := nl.Release(context.Background()); err != nil {
				t.Fatalf("round %d: rival's Release: %v", round, err)
			}
		case errors.Is(err, lease.ErrNotAcquired):
			t.Logf("round %d: holder kept token %d (err %v)", round, l.Token(), l.Err())
		default:
			t.Fatalf("round %d: TryAcquire: %v", round, err)
		}
		l.Close()
		if round < rounds-1 {
			pair.Rebuild()
		}
	}
	// After the last failover, with no standby: the next token is still
	// above every one answered.
	l := mustAcquire(t, b, key)
	grew(rounds, "the last acquirer", l.Token())
	l.Close()
}

// A release does not wait for the synchronous standby (its commit is
// asynchronous), and a release the standby never received is lost in a
// failover without harm: the promoted server shows the row still held
// with the same token until its lease runs out, and then hands out the
// next token.
func TestReleaseIsNotReplicatedFirst(t *testing.T) {
	t.Parallel()
	pair := testenv.PostgresPair(t)
	pool := testenv.Pool(t, pair.DSNFor(pair.CreateSchema()), 4)
	d := testenv.Scale(2 * time.Second)
	// The holder sends no renewal: one waiting for the stalled standby
	// would hold the row, and the release would wait for it.
	adb := newFaultDB(pool)
	adb.set(func(f *faultDB) { f.block["renew"] = true })
	a := newClient(t, adb, lease.WithLease(d))
	b := newClient(t, pool, lease.WithLease(d))
	const key = "leader"
	l := mustAcquire(t, a, key)
	pair.StallStandby()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	// The lease may run out first on a busy machine (a LostError); the
	// release is written all the same.
	if err := l.Release(ctx); err != nil && !errors.As(err, new(*lease.LostError)) {
		pair.ResumeStandby() // so that the commits left waiting can end
		t.Fatalf("Release with the standby stalled: %v (it waited for replication)", err)
	}
	if r := readRow(t, pool, key); !r.Released || r.Token != l.Token() {
		t.Fatalf("row on the primary after the release: %+v", r)
	}
	pair.KillPrimary()
	pair.Promote()
	testenv.Until(t, "the new primary answers", func() (bool, error) { return pool.Ping(context.Background()) == nil, nil })
	if r := readRow(t, pool, key); r.Released || r.Token != l.Token() {
		t.Fatalf("row on the promoted standby: %+v; want the release lost and token %d", r, l.Token())
	}
	nl := mustAcquire(t, b, key)
	defer nl.Close()
	if nl.Token() != l.Token()+1 {
		t.Fatalf("token after the lease ran out: %d, want %d", nl.Token(), l.Token()+1)
	}
}
