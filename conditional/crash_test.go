package conditional_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: the PostgreSQL server crashes (every server process killed at
// once; a cluster of the test's own) while 32 buyers take 1 to 3 units at
// a time from 2,000 units over 4 buckets, coalesced, each retrying every
// error until the key is sold out. After the restart the sale finishes,
// and what the database sold lies between what buyers were told they got
// and that plus the takes left ambiguous by the crash: nothing oversold,
// nothing taken for a buyer who was told it was not, and only what was in
// flight at the crash left ambiguous.
func TestStockServerCrash(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
	defer cancel()
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 16)
	s := newStock(t, pool, conditional.WithBuckets(4))
	const stock, buyers = 2000, 32
	if err := s.Put(ctx, "sku", stock); err != nil {
		t.Fatal(err)
	}
	var granted, ambiguous, failed atomic.Int64 // units; units; calls
	crash := make(chan struct{})
	var crashOnce sync.Once
	var wg sync.WaitGroup
	for b := 0; b < buyers; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(1 + b%3)
			for ctx.Err() == nil {
				err := s.Take(ctx, "sku", n)
				switch {
				case err == nil:
					if granted.Add(n) >= stock/3 {
						crashOnce.Do(func() { close(crash) })
					}
					continue
				case errors.Is(err, conditional.ErrSoldOut):
					if n == 1 {
						return
					}
					n = 1 // smaller takes may still fit
					continue
				case errors.Is(err, conditional.ErrAmbiguousCommit):
					ambiguous.Add(n)
				}
				failed.Add(1)
				time.Sleep(20 * time.Millisecond) // the buyer's pause before it retries
			}
			t.Errorf("buyer %d: %v", b, ctx.Err())
		}()
	}
	<-crash
	srv.CrashFor(300 * time.Millisecond)
	wg.Wait()
	if t.Failed() {
		return
	}
	if failed.Load() == 0 {
		t.Fatal("the crash failed no call: the test tested nothing")
	}
	left := available(t, s, "sku")
	sold := stock - left
	if left != 0 || sold < granted.Load() || sold > granted.Load()+ambiguous.Load() {
		t.Fatalf("%d left, %d sold; want 0 left and between %d granted and %d granted or ambiguous",
			left, sold, granted.Load(), granted.Load()+ambiguous.Load())
	}
	// Only a take sent before the crash can have an unknown outcome: one
	// in flight per buyer, and at most one more through a connection that
	// died idle. A take that found the server down sent nothing.
	if max := int64(2 * buyers * 3); ambiguous.Load() > max {
		t.Fatalf("%d units reported ambiguous, more than the %d that can have been in flight: failures that sent nothing are reported as ErrAmbiguousCommit", ambiguous.Load(), max)
	}
	testenv.Figures(t, "conditional.Stock server crash", "sold %d of %d: %d granted, %d units ambiguous (at most %d can be in flight); %d calls failed across the crash and were retried; 0 oversold",
		sold, stock, granted.Load(), ambiguous.Load(), 2*buyers*3, failed.Load())
}
