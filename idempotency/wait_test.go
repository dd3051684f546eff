package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// A duplicate waits for a request in flight without holding a connection:
// on a pool of 20 connections, while one request holds a key and 30
// duplicates of it wait (patiently: WithWait far longer than the test;
// through the first's Store, which queues them in the process, or each
// through a Store of its own, as 30 processes would, polling the key),
// 100 unrelated payments all run and commit before the first is released;
// then every duplicate replays the first's result. Were each waiting
// duplicate to hold a connection, the unrelated payments would find the
// pool empty until the duplicates gave up, and the duplicates would end
// in ErrInProgress instead of a replay. The peak of connections in use
// and the unrelated payments' latencies with and without the duplicates
// are reported as figures, not asserted.
func TestDuplicatesWaitWithoutAConnection(t *testing.T) {
	t.Parallel()
	for _, stores := range []int{1, 30} {
		t.Run(fmt.Sprint("stores=", stores), func(t *testing.T) {
			t.Parallel()
			duplicatesWaitWithoutAConnection(t, stores)
		})
	}
}

func duplicatesWaitWithoutAConnection(t *testing.T, stores int) {
	const poolSize, duplicates, unrelated = 20, 30, 100
	ctx := context.Background()
	b := newBed(t)
	pool := testenv.Pool(t, testenv.PostgresDSNFor(t, b.schema), poolSize)
	var all []*idempotency.Store
	for range stores {
		s, err := idempotency.New(pool, idempotency.WithWait(testenv.Scale(10*time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		all = append(all, s)
	}
	store := all[0]
	busy := func() (n int64) {
		for _, s := range all {
			n += s.BusyAttempts()
		}
		return n
	}
	mustExec(t, pool, `UPDATE wallets SET balance = 1000000 WHERE account = 'bob'`)

	// latencies runs the unrelated payments, one after another, each a
	// first run of a key of its own on bob's wallet.
	latencies := func(prefix string) []time.Duration {
		d := make([]time.Duration, 0, unrelated)
		for i := range unrelated {
			key := fmt.Sprint(prefix, i)
			start := time.Now()
			res, err := store.Do(ctx, "bob", key, nil, b.pay("bob", key, 1))
			d = append(d, time.Since(start))
			if err != nil || res.Replayed {
				t.Fatalf("unrelated payment %s: %+v, %v; want a first run", key, res, err)
			}
		}
		slices.Sort(d)
		return d
	}
	alone := latencies("alone-")

	// The first holds pay-1 until released.
	claimed, proceed := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		pay := b.pay("alice", "pay-1", 500)
		_, err := store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			body, err := pay(ctx, tx)
			close(claimed)
			<-proceed
			return body, err
		})
		first <- err
	}()
	<-claimed
	var peak atomic.Int32
	sample, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := pool.Stat().AcquiredConns(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sample:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	var replays atomic.Int64
	errs := make(chan error, duplicates)
	for i := range duplicates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := all[i%stores].Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), b.pay("alice", "pay-1", 500))
			switch {
			case err != nil:
				errs <- err
			case !res.Replayed || string(res.Body) != "paid pay-1 500":
				errs <- fmt.Errorf("a duplicate got %+v, want a replay of the first's result", res)
			default:
				replays.Add(1)
			}
		}()
	}
	testenv.Until(t, "the duplicates find the key held", func() (bool, error) {
		return busy() >= duplicates, nil
	})
	beside := latencies("beside-")
	close(proceed)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(sample)
	<-sampled
	close(errs)
	for err := range errs {
		if errors.Is(err, idempotency.ErrInProgress) {
			t.Errorf("a duplicate gave up (%v): the unrelated payments were starved until then", err)
		} else {
			t.Error(err)
		}
	}
	if n := replays.Load(); n != duplicates {
		t.Fatalf("%d of %d duplicates replayed", n, duplicates)
	}
	var ledger, alice int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&ledger); err != nil {
		t.Fatal(err)
	}
	if alice = b.balance("alice"); ledger != 1+2*unrelated || alice != initial-500 {
		t.Fatalf("ledger rows %d, alice %d; want %d rows and one debit of alice", ledger, alice, 1+2*unrelated)
	}
	p := func(d []time.Duration, q int) time.Duration { return d[(len(d)*q-1)/100] }
	testenv.Figures(t, "idempotency duplicates waiting without a connection",
		"%s: pool %d, %d duplicates of one key in flight (%d waits for it): %d unrelated payments ran beside them, all first runs; then %d/%d duplicates replayed; peak connections in use %d of %d; unrelated p50 %v alone, %v beside; p99 %v alone, %v beside (%.2fx)",
		t.Name(), poolSize, duplicates, busy(), unrelated, replays.Load(), duplicates, peak.Load(), poolSize,
		p(alone, 50), p(beside, 50), p(alone, 99), p(beside, 99), float64(p(beside, 99))/float64(p(alone, 99)))
}
