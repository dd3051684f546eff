package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// Lock-delay: a holder that lapsed without releasing keeps the lock
// unavailable until its expiry plus the delay, on the database's clock;
// a clean release frees it at once, whatever the delay.
func TestLockDelay(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	delay := 2 * testLease
	db := newFaultDB(pool)
	a := newClient(t, db, lease.WithLockDelay(delay))
	b := newClient(t, pool, lease.WithLockDelay(delay))

	l := mustAcquire(t, a, "lapsed")
	db.set(func(f *faultDB) { f.block["renew"] = true })
	<-l.Lost()
	lapsed := readRow(t, pool, "lapsed").ExpiresAt
	var took *lease.Lock
	testenv.Until(t, "b takes the lapsed lock", func() (bool, error) {
		nl, err := b.TryAcquire(context.Background(), "lapsed")
		took = nl
		return err == nil, ignoreHeld(err)
	})
	defer took.Close()
	// The new row's expiry is its acquisition's clock_timestamp() plus
	// the lease: the acquisition ran at or after the lapsed expiry plus
	// the delay.
	acquiredAt := readRow(t, pool, "lapsed").ExpiresAt.Add(-testLease)
	if acquiredAt.Before(lapsed.Add(delay)) {
		t.Fatalf("taken %v after the lapsed expiry; lock-delay is %v", acquiredAt.Sub(lapsed), delay)
	}
	t.Logf("lapsed lock taken %v after its expiry (lock-delay %v)", acquiredAt.Sub(lapsed).Round(time.Millisecond), delay)

	r := mustAcquire(t, a, "released")
	if err := r.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	nl, err := b.TryAcquire(context.Background(), "released")
	if err != nil {
		t.Fatalf("a released lock with a lock-delay of %v: %v", delay, err)
	}
	nl.Close()
}

// FenceSQL lets the holder's own statement commit only while its lease is
// held; after a takeover the old holder's statement changes nothing, and
// conditional.Fenced refuses its token.
func TestFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	db := newFaultDB(pool)
	a := newClient(t, db)
	b := newClient(t, pool)
	if _, err := pool.Exec(ctx, `CREATE TABLE report (day text PRIMARY KEY, body text, fence bigint NOT NULL DEFAULT 0);
INSERT INTO report (day, body) VALUES ('d1', '')`); err != nil {
		t.Fatal(err)
	}
	write := `UPDATE report SET body = $3 WHERE day = 'd1' AND ` + a.FenceSQL(1, 2)
	f, err := conditional.NewFenced("report", "day", "fence")
	if err != nil {
		t.Fatal(err)
	}
	old := mustAcquire(t, a, "report")
	if tag, err := pool.Exec(ctx, write, old.Key(), old.Token(), "old"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("holder's fenced write: %v, %d rows", err, tag.RowsAffected())
	}
	if err := f.Update(ctx, pool, "d1", old.Token(), nil); err != nil {
		t.Fatal(err)
	}
	db.set(func(f *faultDB) { f.block["renew"] = true })
	var nl *lease.Lock
	testenv.Until(t, "b takes over", func() (bool, error) {
		l, err := b.TryAcquire(ctx, "report")
		nl = l
		return err == nil, ignoreHeld(err)
	})
	defer nl.Close()
	if tag, err := pool.Exec(ctx, write, nl.Key(), nl.Token(), "new"); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("new holder's write: %v, %d rows", err, tag.RowsAffected())
	}
	if err := f.Update(ctx, pool, "d1", nl.Token(), nil); err != nil {
		t.Fatal(err)
	}
	if tag, err := pool.Exec(ctx, write, old.Key(), old.Token(), "stale"); err != nil || tag.RowsAffected() != 0 {
		t.Fatalf("stale write through FenceSQL: %v, %d rows", err, tag.RowsAffected())
	}
	if err := f.Update(ctx, pool, "d1", old.Token(), map[string]any{"body": "stale"}); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("stale write through conditional.Fenced: %v", err)
	}
	var body string
	if err := pool.QueryRow(ctx, "SELECT body FROM report").Scan(&body); err != nil || body != "new" {
		t.Fatalf("body %q, %v", body, err)
	}
}
