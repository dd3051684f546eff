package conditional_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

const (
	envStockDSN     = "NOLOCK_STOCK_DSN"
	envStockBuckets = "NOLOCK_STOCK_BUCKETS"
)

// TestChildBuyer is a child's body: a process with its own pool and its
// own coalescing Stock, whose 16 buyers take one unit of "hot" at a time
// until it is sold out, then print how many they got.
func TestChildBuyer(t *testing.T) {
	testenv.ChildOnly(t)
	buckets, err := strconv.Atoi(os.Getenv(envStockBuckets))
	if err != nil {
		t.Fatal(err)
	}
	s, err := conditional.NewStock(testenv.Pool(t, os.Getenv(envStockDSN), 8), conditional.WithBuckets(buckets))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fmt.Println("ready")
	var sold atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				switch err := s.Take(context.Background(), "hot", 1); {
				case errors.Is(err, conditional.ErrSoldOut):
					return
				case err != nil:
					t.Error(err)
					return
				}
				sold.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("sold=%d\n", sold.Load())
}

// Several processes, each coalescing in its own Stock, sell one hot key:
// together they sell exactly the stock, nothing left and nothing oversold.
func TestStockSeveralProcessesSellExactly(t *testing.T) {
	t.Parallel()
	for _, buckets := range []int{1, 8} {
		t.Run(fmt.Sprintf("buckets=%d", buckets), func(t *testing.T) {
			t.Parallel()
			pool, schema := testenv.PostgresSchema(t, 4)
			s := newStock(t, pool, conditional.WithBuckets(buckets))
			const units = 3000
			if err := s.Put(context.Background(), "hot", units); err != nil {
				t.Fatal(err)
			}
			var kids []*testenv.Child
			for range 3 {
				kids = append(kids, testenv.StartChild(t, "TestChildBuyer",
					envStockDSN+"="+testenv.PostgresDSNFor(t, schema), envStockBuckets+"="+strconv.Itoa(buckets)))
			}
			var sold int64
			for i, k := range kids {
				line := k.WaitFor("sold=", 2*time.Minute)
				n, err := strconv.ParseInt(strings.TrimPrefix(strings.TrimSpace(line), "sold="), 10, 64)
				if err != nil {
					t.Fatalf("child %d: %q: %v", i, line, err)
				}
				sold += n
			}
			if left := available(t, s, "hot"); sold != units || left != 0 {
				t.Fatalf("three processes sold %d, %d left; want exactly %d sold, 0 left", sold, left, units)
			}
		})
	}
}
