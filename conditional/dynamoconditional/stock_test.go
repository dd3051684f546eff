package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

func newDynamoStock(t *testing.T, client dynamoconditional.DynamoDBAPI, table string, buckets int) *dynamoconditional.Stock {
	t.Helper()
	s, err := dynamoconditional.NewStock(client, table, dynamoconditional.WithBuckets(buckets))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func dynamoAvailable(t *testing.T, s *dynamoconditional.Stock, key string) int64 {
	t.Helper()
	n, err := s.Available(context.Background(), key)
	if err != nil {
		t.Fatalf("Available(%q): %v", key, err)
	}
	return n
}

// dynamoQty returns the units in one bucket's item, -1 if there is none.
func dynamoQty(t *testing.T, item map[string]types.AttributeValue) int64 {
	t.Helper()
	if item == nil {
		return -1
	}
	v, ok := item[dynamoconditional.QtyAttr].(*types.AttributeValueMemberN)
	if !ok {
		t.Fatalf("item %v has no number %q", item, dynamoconditional.QtyAttr)
	}
	var n int64
	if _, err := fmt.Sscan(v.Value, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDynamoStockTakePutAvailable(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			faults := &dynamoFaults{DynamoDBAPI: client}
			s := newDynamoStock(t, faults, table, 1)
			if err := s.Put(ctx, "sku", 10); err != nil {
				t.Fatal(err)
			}
			if got := dynamoQty(t, dynamoItem(t, client, table, "sku#0")); got != 10 {
				t.Fatalf("item sku#0 holds %d, want 10", got)
			}
			if err := s.Take(ctx, "sku", 3); err != nil {
				t.Fatalf("Take 3 of 10: %v", err)
			}
			reads := faults.reads.Load()
			if err := s.Take(ctx, "sku", 8); !errors.Is(err, dynamoconditional.ErrSoldOut) {
				t.Fatalf("Take 8 of 7: %v, want ErrSoldOut", err)
			}
			// moto returns the item with the failed condition; dynalite
			// does not, so the refusal costs one read there.
			if got, want := faults.reads.Load()-reads, map[bool]int64{true: 0, false: 1}[server.tx]; got != want {
				t.Errorf("a refused take read %d times, want %d", got, want)
			}
			if got := dynamoAvailable(t, s, "sku"); got != 7 {
				t.Fatalf("available %d after a refused take, want 7", got)
			}
			if err := s.Take(ctx, "sku", 7); err != nil {
				t.Fatalf("Take the last 7: %v", err)
			}
			if err := s.Take(ctx, "sku", 1); !errors.Is(err, dynamoconditional.ErrSoldOut) {
				t.Fatalf("Take from empty: %v, want ErrSoldOut", err)
			}
			if err := s.Put(ctx, "sku", 2); err != nil {
				t.Fatal(err)
			}
			if got := dynamoAvailable(t, s, "sku"); got != 2 {
				t.Fatalf("available %d after restocking 2, want 2", got)
			}
			if err := s.Take(ctx, "nope", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Take of an unknown key: %v, want ErrNotFound", err)
			}
			if _, err := s.Available(ctx, "nope"); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Available of an unknown key: %v, want ErrNotFound", err)
			}
			if dynamoItem(t, client, table, "nope#0") != nil {
				t.Fatal("a take of an unknown key created an item")
			}
			// A key may contain the separator: "a#1" bucket 0 is "a#1#0".
			if err := s.Put(ctx, "a#1", 4); err != nil {
				t.Fatal(err)
			}
			if err := s.Take(ctx, "a", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Take of \"a\" beside \"a#1\": %v, want ErrNotFound", err)
			}
			// A bucket never exceeds an int64.
			if err := s.Put(ctx, "max", math.MaxInt64); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(ctx, "max", 1); err == nil {
				t.Fatal("Put past MaxInt64 succeeded")
			}
			if got := dynamoAvailable(t, s, "max"); got != math.MaxInt64 {
				t.Fatalf("available %d, want MaxInt64", got)
			}
		})
	}
}

func TestDynamoStockBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	faults := &dynamoFaults{DynamoDBAPI: client}
	s := newDynamoStock(t, faults, table, 3)
	if err := s.Put(ctx, "sku", 5); err != nil {
		t.Fatal(err)
	}
	calls := faults.calls.Load()
	long := strings.Repeat("k", dynamoconditional.MaxKeyLen+1)
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
		{"put more than the buckets hold", "sku", "n 9223372036854775807 is more than 3 buckets can hold", math.MaxInt64, s.Put},
		{"available empty key", "", "key is empty", 0, func(ctx context.Context, key string, _ int64) error {
			_, err := s.Available(ctx, key)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op(ctx, tc.key, tc.n)
			if !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := faults.calls.Load() - calls; n != 0 {
		t.Fatalf("bad input made %d calls to DynamoDB, want none", n)
	}
	if got := dynamoAvailable(t, s, "sku"); got != 5 {
		t.Fatalf("bad input changed the stock: %d, want 5", got)
	}
	if n := dynamoCount(t, client, table); n != 3 {
		t.Fatalf("%d items, want the 3 buckets of sku", n)
	}
	for _, tc := range []struct {
		name   string
		client dynamoconditional.DynamoDBAPI
		table  string
		opts   []dynamoconditional.Option
		want   string
	}{
		{"nil client", nil, table, nil, "client is nil"},
		{"empty table", client, "", nil, "table is empty"},
		{"zero buckets", client, table, []dynamoconditional.Option{dynamoconditional.WithBuckets(0)}, "WithBuckets(0)"},
		{"too many buckets", client, table, []dynamoconditional.Option{dynamoconditional.WithBuckets(101)}, "WithBuckets(101)"},
	} {
		if _, err := dynamoconditional.NewStock(tc.client, tc.table, tc.opts...); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewStock with %s: %v, want ErrInvalid naming %q", tc.name, err, tc.want)
		}
	}
}

// dynamoBuyers runs workers goroutines, each taking size(w) units until it
// is refused, and returns the units granted. A buyer stops at its first
// ErrSoldOut, so when units remain that it could have taken, the count
// falls short of the stock and the test fails. Buyers also stop once more
// than units were sold, so an oversell fails the test instead of hanging
// it. takes[w] counts the takes granted to worker w.
func dynamoBuyers(t *testing.T, s *dynamoconditional.Stock, key string, units int64, workers int, size func(w int) int64) (sold int64, takes []int64) {
	t.Helper()
	var total atomic.Int64
	takes = make([]int64, workers)
	dynamoRun(t, workers, func(w int) error {
		n := size(w)
		for {
			err := s.Take(context.Background(), key, n)
			if errors.Is(err, dynamoconditional.ErrSoldOut) {
				return nil
			}
			if err != nil {
				return err
			}
			takes[w]++
			if got := total.Add(n); got > units {
				return fmt.Errorf("oversold: %d units granted of %d", got, units)
			}
		}
	})
	return total.Load(), takes
}

// Buyers race for the stock until they are refused: exactly the stock is
// sold, nothing is left, and nobody is refused while units remain. On
// dynalite with buckets, every take fits one bucket; on moto, buyers of 1
// and 40 units over buckets of 30 also take across buckets in
// transactions, racing the single-bucket takes.
func TestDynamoStockBuyersSellExactlyTheStock(t *testing.T) {
	t.Parallel()
	type race struct {
		tx               bool
		buckets, workers int
		units            int64
		sizes            []int64
	}
	var races []race
	for _, buckets := range []int{1, 4} {
		for _, units := range []int64{1, 3, 300} {
			races = append(races, race{false, buckets, 16, units, []int64{1}})
		}
	}
	// Buckets of 30: a take of 40 always needs a transaction.
	races = append(races, race{true, 1, 8, 40, []int64{1}}, race{true, 4, 8, 120, []int64{1, 40}})
	for _, r := range races {
		server := map[bool]string{false: "dynalite", true: "moto"}[r.tx]
		t.Run(fmt.Sprintf("%s/buckets=%d/units=%d/sizes=%v", server, r.buckets, r.units, r.sizes), func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, r.tx)
			faults := &dynamoFaults{DynamoDBAPI: client}
			s := newDynamoStock(t, faults, testenv.Table(t, client, false), r.buckets)
			if err := s.Put(context.Background(), "hot", r.units); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			size := func(w int) int64 { return r.sizes[w%len(r.sizes)] }
			sold, takes := dynamoBuyers(t, s, "hot", r.units, r.workers, size)
			elapsed := time.Since(start)
			if left := dynamoAvailable(t, s, "hot"); sold != r.units || left != 0 {
				t.Fatalf("sold %d, left %d; want exactly %d sold, 0 left", sold, left, r.units)
			}
			t.Logf("%d calls (%.0f/s), %d of them transactions (%d cancelled)", faults.calls.Load(),
				float64(faults.calls.Load())/elapsed.Seconds(), faults.transactions.Load(), faults.cancelled.Load())
			if slices.Contains(r.sizes, 40) {
				// Every take of 40 needs a transaction, racing the takes of
				// 1 on the same buckets: some must win (levelled, 2 of a
				// possible 3 did in every run; taking whole buckets, fullest
				// first, none ever did).
				var large int64
				for w, n := range takes {
					if size(w) == 40 {
						large += n
					}
				}
				if large == 0 {
					t.Fatalf("no take of 40 was granted (%d transactions, %d cancelled): takes across buckets starve", faults.transactions.Load(), faults.cancelled.Load())
				}
			}
		})
	}
}

// When no bucket covers a take but the buckets together do, one
// transaction takes across them; the items follow the documented layout.
func TestDynamoStockTakeAcrossBuckets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	faults := &dynamoFaults{DynamoDBAPI: client}
	s := newDynamoStock(t, faults, table, 4)
	if err := s.Put(ctx, "sku", 9); err != nil {
		t.Fatal(err)
	}
	for b, want := range []int64{3, 2, 2, 2} {
		if got := dynamoQty(t, dynamoItem(t, client, table, fmt.Sprintf("sku#%d", b))); got != want {
			t.Fatalf("bucket %d holds %d, want %d", b, got, want)
		}
	}
	if err := s.Take(ctx, "sku", 8); err != nil {
		t.Fatalf("Take 8 of 9 over four buckets: %v", err)
	}
	if n := faults.transactions.Load(); n != 1 {
		t.Fatalf("%d transactions, want 1", n)
	}
	if got := dynamoAvailable(t, s, "sku"); got != 1 {
		t.Fatalf("available %d, want 1", got)
	}
	if err := s.Take(ctx, "sku", 2); !errors.Is(err, dynamoconditional.ErrSoldOut) {
		t.Fatalf("Take 2 of 1: %v, want ErrSoldOut", err)
	}
	if err := s.Take(ctx, "sku", 1); err != nil {
		t.Fatalf("Take the last unit: %v", err)
	}
	if err := s.Take(ctx, "sku", 1); !errors.Is(err, dynamoconditional.ErrSoldOut) {
		t.Fatalf("Take from empty: %v, want ErrSoldOut", err)
	}
	if err := s.Take(ctx, "nope", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
		t.Fatalf("Take of an unknown key: %v, want ErrNotFound", err)
	}
	if n := faults.transactions.Load(); n != 1 {
		t.Fatalf("%d transactions, want still 1: only the take of 8 needed one", n)
	}
	// A take across buckets lowers the fullest to a common level, leaving
	// each bucket as many units as it can for concurrent single takes.
	if err := s.Put(ctx, "level", 38); err != nil { // 10, 10, 9, 9
		t.Fatal(err)
	}
	if err := s.Take(ctx, "level", 14); err != nil {
		t.Fatalf("Take 14 of 38: %v", err)
	}
	for b, want := range []int64{6, 6, 6, 6} {
		if got := dynamoQty(t, dynamoItem(t, client, table, fmt.Sprintf("level#%d", b))); got != want {
			t.Fatalf("after taking 14 of 10, 10, 9, 9: bucket %d holds %d, want %d", b, got, want)
		}
	}
	if err := s.Take(ctx, "level", 23); err != nil {
		t.Fatalf("Take 23 of 24: %v", err)
	}
	if got := dynamoAvailable(t, s, "level"); got != 1 {
		t.Fatalf("available %d, want 1", got)
	}
}

// On a server without transactions, a take that no single bucket covers
// fails with an error wrapping errors.ErrUnsupported, never ErrSoldOut,
// and takes nothing; takes that fit one bucket, and a verdict of sold out
// from the buckets' sum, still work.
func TestDynamoStockAcrossBucketsWithoutTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	s := newDynamoStock(t, client, testenv.Table(t, client, false), 4)
	if err := s.Put(ctx, "sku", 8); err != nil {
		t.Fatal(err)
	}
	err := s.Take(ctx, "sku", 7)
	if !errors.Is(err, errors.ErrUnsupported) || errors.Is(err, dynamoconditional.ErrSoldOut) || !strings.Contains(err.Error(), "TransactWriteItems") {
		t.Fatalf("Take 7 of 8 over four buckets on dynalite: %v, want ErrUnsupported naming TransactWriteItems", err)
	}
	t.Logf("without transactions: %v", err)
	if got := dynamoAvailable(t, s, "sku"); got != 8 {
		t.Fatalf("available %d after the refused take, want 8", got)
	}
	if err := s.Take(ctx, "sku", 9); !errors.Is(err, dynamoconditional.ErrSoldOut) {
		t.Fatalf("Take 9 of 8: %v, want ErrSoldOut", err)
	}
	if err := s.Take(ctx, "sku", 2); err != nil {
		t.Fatalf("Take 2, which one bucket covers: %v", err)
	}
	if got := dynamoAvailable(t, s, "sku"); got != 6 {
		t.Fatalf("available %d, want 6", got)
	}
}
