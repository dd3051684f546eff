package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// newStock opens a Stock on a fresh schema and closes it when the test ends.
func newStock(t *testing.T, pool *pgxpool.Pool, opts ...conditional.Option) *conditional.Stock {
	t.Helper()
	s, err := conditional.NewStock(pool, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func available(t *testing.T, s *conditional.Stock, key string) int64 {
	t.Helper()
	n, err := s.Available(context.Background(), key)
	if err != nil {
		t.Fatalf("Available(%q): %v", key, err)
	}
	return n
}

func TestStockTakePutAvailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStock(t, testenv.Postgres(t))
	if err := s.Put(ctx, "sku", 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, "sku", 3); err != nil {
		t.Fatalf("Take 3 of 10: %v", err)
	}
	if err := s.Take(ctx, "sku", 8); !errors.Is(err, conditional.ErrSoldOut) {
		t.Fatalf("Take 8 of 7: %v, want ErrSoldOut", err)
	}
	if got := available(t, s, "sku"); got != 7 {
		t.Fatalf("available %d after a refused take, want 7", got)
	}
	if err := s.Take(ctx, "sku", 7); err != nil {
		t.Fatalf("Take the last 7: %v", err)
	}
	if err := s.Take(ctx, "sku", 1); !errors.Is(err, conditional.ErrSoldOut) {
		t.Fatalf("Take from empty: %v, want ErrSoldOut", err)
	}
	if err := s.Put(ctx, "sku", 2); err != nil {
		t.Fatal(err)
	}
	if got := available(t, s, "sku"); got != 2 {
		t.Fatalf("available %d after restocking 2, want 2", got)
	}
	if err := s.Take(ctx, "nope", 1); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("Take of an unknown key: %v, want ErrNotFound", err)
	}
	if _, err := s.Available(ctx, "nope"); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("Available of an unknown key: %v, want ErrNotFound", err)
	}
	const big = 1e15 // beyond int4: every quantity is a bigint
	if err := s.Put(ctx, "big", big); err != nil {
		t.Fatal(err)
	}
	if got := available(t, s, "big"); got != big {
		t.Fatalf("available %d, want %d", got, int64(big))
	}
}

func TestStockBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := newStock(t, pool)
	if err := s.Put(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("k", conditional.MaxKeyLen+1)
	for _, tc := range []struct {
		name, key, want string
		n               int64
		op              func(context.Context, string, int64) error
	}{
		{"take zero", "sku", "n must be positive", 0, s.Take},
		{"take negative", "sku", "n must be positive", -3, s.Take},
		{"take empty key", "", "key is empty", 1, s.Take},
		{"take long key", long, "key is 513 bytes", 1, s.Take},
		{"take NUL key", "a\x00b", "NUL", 1, s.Take},
		{"put zero", "sku", "n must be positive", 0, s.Put},
		{"put negative", "sku", "n must be positive", -1, s.Put},
		{"put empty key", "", "key is empty", 1, s.Put},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op(ctx, tc.key, tc.n)
			if !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if got := available(t, s, "sku"); got != 5 {
		t.Fatalf("bad input changed the stock: %d, want 5", got)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM nolock_stock").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("rows %d (%v), want 1", rows, err)
	}
	for _, opts := range [][]conditional.Option{
		{conditional.WithBuckets(0)}, {conditional.WithMaxBatch(0)}, {conditional.WithTable("")},
		{conditional.WithSoldOutCache(-1)},
	} {
		if _, err := conditional.NewStock(pool, opts...); !errors.Is(err, conditional.ErrInvalid) {
			t.Errorf("NewStock with a bad option: %v, want ErrInvalid", err)
		}
	}
}

// buyers runs workers goroutines, each taking sizes[i % len(sizes)] units
// until it is refused, and returns the units granted. A buyer stops at its
// first ErrSoldOut, so when units remain that some buyer could have taken,
// the count falls short of the stock and the test fails.
func buyers(t *testing.T, stocks []*conditional.Stock, key string, workers int, size func(w int) int64) (granted int64) {
	t.Helper()
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stocks[w%len(stocks)]
			n := size(w)
			for {
				err := s.Take(context.Background(), key, n)
				if errors.Is(err, conditional.ErrSoldOut) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				total.Add(n)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return total.Load()
}

// sellOut stocks units on "hot", lets the buyers loose on the stocks, and
// checks that exactly the stock was sold and nothing is left.
func sellOut(t *testing.T, stocks []*conditional.Stock, units int64, workers int, size func(w int) int64) {
	t.Helper()
	if err := stocks[0].Put(context.Background(), "hot", units); err != nil {
		t.Fatal(err)
	}
	sold := buyers(t, stocks, "hot", workers, size)
	if left := available(t, stocks[0], "hot"); sold != units || left != 0 {
		t.Fatalf("sold %d, left %d across %d stock(s); want exactly %d sold, 0 left", sold, left, len(stocks), units)
	}
}

func TestStockConcurrentBuyersSellExactlyTheStock(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 4, 16, 64} {
		for _, units := range []int64{1, 3, 2000} {
			for _, coalesce := range []bool{true, false} {
				name := fmt.Sprintf("buckets=%d/units=%d/coalesce=%v", buckets, units, coalesce)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					s := newStock(t, testenv.Postgres(t), conditional.WithBuckets(buckets), conditional.WithCoalescing(coalesce))
					sellOut(t, []*conditional.Stock{s}, units, 32, func(int) int64 { return 1 })
				})
			}
		}
	}
}

func TestStockMixedSizesConserveUnits(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 16} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			t.Parallel()
			s := newStock(t, testenv.Postgres(t), conditional.WithBuckets(buckets))
			// Buyers of 1, 2 and 5 units; the 1-unit buyers keep going
			// until nothing at all is left.
			sellOut(t, []*conditional.Stock{s}, 1001, 30, func(w int) int64 { return []int64{1, 2, 5}[w%3] })
		})
	}
}

// Several processes (here: several pools, each with its own Stock and its
// own coalescer) selling one key stay exact: the row lock decides.
func TestStockSeveralProcessesStayExact(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 8} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.PostgresSchema(t, 8)
			first := newStock(t, pool, conditional.WithBuckets(buckets))
			stocks := []*conditional.Stock{first}
			for i := 0; i < 3; i++ {
				other := testenv.Pool(t, testenv.PostgresDSNFor(t, schema), 8)
				stocks = append(stocks, newStock(t, other, conditional.WithBuckets(buckets)))
			}
			sellOut(t, stocks, 3000, 48, func(int) int64 { return 1 })
		})
	}
}

// lockedStock returns a Stock holding 10 units of "sku" whose row another
// transaction has locked until release runs (or the test ends), so takes
// block on it.
func lockedStock(t *testing.T, pool *pgxpool.Pool, opts ...conditional.Option) (s *conditional.Stock, release func()) {
	t.Helper()
	ctx := context.Background()
	s = newStock(t, pool, opts...)
	if err := s.Put(ctx, "sku", 10); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM nolock_stock WHERE key = 'sku' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	release = func() { tx.Rollback(ctx) }
	t.Cleanup(release) // a failed test must not leave the pool waiting on it
	return s, release
}

// queued is the function in which a coalesced call waits while another
// of its key is in flight: the combiner's queue.
const queued = "internal/combine.(*Combiner[...]).Do"

func TestStockCancelWithdrawsUnsentTake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s, release := lockedStock(t, pool)
	first := make(chan error, 1)
	go func() { first <- s.Take(ctx, "sku", 4) }()
	testenv.WaitLockWaiters(t, pool, 1) // sent, blocked on the row lock
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := s.Take(cctx, "sku", 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued take whose context ended: %v, want DeadlineExceeded", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatalf("first take: %v", err)
	}
	if got := available(t, s, "sku"); got != 6 {
		t.Fatalf("available %d; want 6: the withdrawn take must not have run", got)
	}
}

func TestStockCloseFailsUnsentTakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s, release := lockedStock(t, pool)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- s.Take(ctx, "sku", 1) }()
	testenv.WaitLockWaiters(t, pool, 1) // sent, blocked on the row lock
	go func() { second <- s.Take(ctx, "sku", 2) }()
	testenv.WaitParked(t, 1, queued)
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	if err := <-second; !errors.Is(err, conditional.ErrClosed) {
		// The queued take is answered at once...
		t.Fatalf("queued take at Close: %v, want ErrClosed", err)
	}
	select {
	case <-closed:
		t.Fatal("Close returned while a statement was in flight")
	case <-time.After(100 * time.Millisecond): // time for a wrong Close to return
	}
	release()
	<-closed // ...and Close waits for the one in flight.
	if err := <-first; err != nil {
		t.Fatalf("in-flight take at Close: %v", err)
	}
	if err := s.Take(ctx, "sku", 1); !errors.Is(err, conditional.ErrClosed) {
		t.Fatalf("take after Close: %v, want ErrClosed", err)
	}
	if got := available(t, s, "sku"); got != 9 {
		t.Fatalf("available %d; want 9", got)
	}
}

// A batch the stock covers only in part grants whole requests first fit in
// arrival order and refuses the rest with ErrSoldOut; a batch it covers in
// full is granted by one decrement of the batch's sum.
func TestStockBatchGrantsFirstFitInArrivalOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s, release := lockedStock(t, pool)
	take := func(n int64) error { return s.Take(ctx, "sku", n) }
	// 9 left after the first take of 1: 4 fits, 6 not, 2 and 1 fit.
	errs := batchBehind(t, pool, release, take, 1, 4, 6, 2, 1)
	for i, want := range []error{nil, nil, conditional.ErrSoldOut, nil, nil} {
		if err := errs[i]; !errors.Is(err, want) || (err == nil) != (want == nil) {
			t.Errorf("take %d: %v, want %v", i, err, want)
		}
	}
	if n := available(t, s, "sku"); n != 2 {
		t.Fatalf("available %d after taking 1+4+2+1 of 10, want 2", n)
	}

	// Now a batch the 2 units cover in full: two takes of 1 queued behind a held lock.
	pool2 := testenv.Postgres(t)
	s2, release2 := lockedStock(t, pool2)
	for i, err := range batchBehind(t, pool2, release2, func(n int64) error { return s2.Take(ctx, "sku", n) }, 8, 1, 1) {
		if err != nil {
			t.Fatalf("take %d, covered by the stock: %v", i, err)
		}
	}
	if n := available(t, s2, "sku"); n != 0 {
		t.Fatalf("available %d after taking 8+1+1 of 10, want 0", n)
	}
}

// batchBehind runs op(amounts[0]) while a transaction holds the row (on
// db, a pool of the test's schema), waits until it is sent and blocked on
// the row lock, queues op on the other amounts behind it one after the
// other, each once the one before waits in the queue, so that they go out
// as one batch in this order, then calls release and returns every call's
// error, in order.
func batchBehind(t *testing.T, db testenv.Querier, release func(), op func(int64) error, amounts ...int64) []error {
	t.Helper()
	out := make([]chan error, len(amounts))
	for i, n := range amounts {
		out[i] = make(chan error, 1)
		go func() { out[i] <- op(n) }()
		if i == 0 {
			testenv.WaitLockWaiters(t, db, 1)
		} else {
			testenv.WaitParked(t, i, queued)
		}
	}
	release()
	errs := make([]error, len(out))
	for i, c := range out {
		errs[i] = <-c
	}
	return errs
}

// The endgame gathers a key's last units into its first bucket, and later
// takes go there, whatever bucket they would have drawn.
func TestStockEndgameGathersTheLastUnits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	s := newStock(t, pool, conditional.WithBuckets(16), conditional.WithEndgame(200))
	if err := s.Put(ctx, "sku", 160); err != nil { // 10 per bucket
		t.Fatal(err)
	}
	buckets := func() []int64 {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT qty FROM nolock_stock WHERE key = 'sku' ORDER BY bucket`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var q []int64
		for rows.Next() {
			var n int64
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			q = append(q, n)
		}
		return q
	}
	// 11 units: more than any bucket holds, so the take goes across
	// buckets, finds 160 <= 200 left, and gathers them.
	if err := s.Take(ctx, "sku", 11); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := s.Take(ctx, "sku", 1); err != nil {
			t.Fatalf("take %d after gathering: %v", i, err)
		}
	}
	q := buckets()
	if q[0] != 160-11-20 {
		t.Fatalf("first bucket holds %d after gathering and 20 takes, want %d (buckets %v)", q[0], 160-11-20, q)
	}
	for b, n := range q[1:] {
		if n != 0 {
			t.Fatalf("bucket %d holds %d after gathering, want 0 (buckets %v)", b+1, n, q)
		}
	}
	for _, bad := range []conditional.Option{conditional.WithEndgame(-1)} {
		if _, err := conditional.NewStock(pool, conditional.WithBuckets(4), bad); !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), "WithEndgame") {
			t.Fatalf("negative endgame: %v, want ErrInvalid naming endgame", err)
		}
	}
	if _, err := conditional.NewStock(pool, conditional.WithEndgame(10)); !errors.Is(err, conditional.ErrInvalid) || !strings.Contains(err.Error(), "WithBuckets") {
		t.Fatalf("endgame without buckets: %v, want ErrInvalid naming buckets", err)
	}
}

// With the endgame on, concurrent buyers still sell exactly the stock,
// across several processes (pools).
func TestStockEndgameSellsExactly(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{4, 16, 64} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.PostgresSchema(t, 8)
			stocks := []*conditional.Stock{newStock(t, pool, conditional.WithBuckets(buckets), conditional.WithEndgame(300))}
			for i := 0; i < 2; i++ {
				other := testenv.Pool(t, testenv.PostgresDSNFor(t, schema), 8)
				stocks = append(stocks, newStock(t, other, conditional.WithBuckets(buckets), conditional.WithEndgame(300)))
			}
			sellOut(t, stocks, 2000, 36, func(w int) int64 { return []int64{1, 1, 3}[w%3] })
		})
	}
}

// Buckets may hold more between them than one int64: Available saturates,
// and a take across buckets still sees enough stock.
func TestStockBucketsPastInt64(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStock(t, testenv.Postgres(t), conditional.WithBuckets(4))
	const half = int64(1) << 62
	for range 3 { // 3 × 2^62 over 4 buckets: each under 2^62, together past int64
		if err := s.Put(ctx, "sku", half); err != nil {
			t.Fatal(err)
		}
	}
	if got := available(t, s, "sku"); got != math.MaxInt64 {
		t.Fatalf("available %d, want it saturated at %d", got, int64(math.MaxInt64))
	}
	// More than any one bucket holds (3 × 2^60 each): taken across buckets.
	if err := s.Take(ctx, "sku", half); err != nil {
		t.Fatalf("take of 2^62 from 3 × 2^62: %v", err)
	}
}
