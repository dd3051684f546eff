package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Concurrent takes that add up to exactly the stock are all granted, with
// fewer writes than takes (coalesced), and then the key is sold out; with
// coalescing off, each take is its own write. A false sold-out answer
// (units left that the batch could have covered) fails it.
func TestCoalescedTakesExact(t *testing.T) {
	t.Parallel()
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprint("coalesce=", coalesce), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, false)
			faults := &dynamoFaults{DynamoDBAPI: client}
			s, err := dynamoconditional.NewStock(faults, testenv.Table(t, client, false), dynamoconditional.WithCoalescing(coalesce))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const workers, each = 32, 10 // takes of 1, 2 and 3 units
			var stock int64
			for w := 0; w < workers; w++ {
				for i := 0; i < each; i++ {
					stock += int64(1 + (w+i)%3)
				}
			}
			if err := s.Put(ctx, "hot", stock); err != nil {
				t.Fatal(err)
			}
			before := faults.calls.Load() - faults.reads.Load()
			dynamoRun(t, workers, func(w int) error {
				for i := 0; i < each; i++ {
					if err := s.Take(ctx, "hot", int64(1+(w+i)%3)); err != nil {
						return fmt.Errorf("take %d of %d units: %w", i, 1+(w+i)%3, err)
					}
				}
				return nil
			})
			writes := faults.calls.Load() - faults.reads.Load() - before
			if left := dynamoAvailable(t, s, "hot"); left != 0 {
				t.Errorf("%d units left after takes adding up to the stock", left)
			}
			if err := s.Take(ctx, "hot", 1); !errors.Is(err, dynamoconditional.ErrSoldOut) {
				t.Errorf("a take past the stock: %v, want ErrSoldOut", err)
			}
			t.Logf("%d takes, %d writes", workers*each, writes)
			if coalesce && writes >= workers*each || !coalesce && writes != workers*each {
				t.Errorf("%d takes sent %d writes (coalesce %v)", workers*each, writes, coalesce)
			}
		})
	}
}

// Takes asking for more than the stock: never more granted than put, and
// a take is refused only when what is left could not cover it (units only
// go down, so what is left at the end bounds what was left at each
// refusal, less the takes granted before it).
func TestCoalescedTakesRefuseOnlyWhatCannotBeCovered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	s := newDynamoStock(t, client, testenv.Table(t, client, false), 1)
	const stock = 200
	if err := s.Put(ctx, "hot", stock); err != nil {
		t.Fatal(err)
	}
	var sold atomic.Int64
	var mu sync.Mutex
	refused := map[int64]int{} // size → refusals
	dynamoRun(t, 32, func(w int) error {
		for i := 0; i < 12; i++ {
			n := int64(1 + (w*7+i)%5)
			switch err := s.Take(ctx, "hot", n); {
			case err == nil:
				sold.Add(n)
			case errors.Is(err, dynamoconditional.ErrSoldOut):
				mu.Lock()
				refused[n]++
				mu.Unlock()
			default:
				return err
			}
		}
		return nil
	})
	left := dynamoAvailable(t, s, "hot")
	if sold.Load()+left != stock {
		t.Errorf("sold %d + left %d != %d", sold.Load(), left, stock)
	}
	for n := range refused {
		if n <= left {
			t.Errorf("a take of %d units was refused, yet %d are left", n, left)
		}
	}
	t.Logf("sold %d, left %d, refusals by size %v", sold.Load(), left, refused)
}

// Each take's outcome reaches the observer, and so do the coalesced
// writes: 40 concurrent takes of one unit from 30 give 30 granted and 10
// refused events, and the batch events carry no more takes than were made.
func TestStockObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	events := &testenv.Events{}
	s, err := dynamoconditional.NewStock(client, testenv.Table(t, client, false), dynamoconditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Put(ctx, "sku", 30); err != nil {
		t.Fatal(err)
	}
	const takes = 40
	dynamoRun(t, takes, func(int) error {
		if err := s.Take(ctx, "sku", 1); err != nil && !errors.Is(err, dynamoconditional.ErrSoldOut) {
			return err
		}
		return nil
	})
	if g, r, f := len(events.Of("sku", dynamoconditional.EventGranted)), len(events.Of("sku", dynamoconditional.EventRefused)), len(events.Of("sku", dynamoconditional.EventFailed)); g != 30 || r != takes-30 || f != 0 {
		t.Errorf("%d granted, %d refused, %d failed events; want 30, %d, 0", g, r, f, takes-30)
	}
	for _, err := range events.Errs("sku", dynamoconditional.EventRefused) {
		if !errors.Is(err, dynamoconditional.ErrSoldOut) {
			t.Errorf("refused event's error %v, want ErrSoldOut", err)
		}
	}
	var batched int64
	for _, e := range events.Of("sku#0", dynamoconditional.EventBatch) {
		batched += e.N
	}
	if batched > takes {
		t.Errorf("batch events carry %d takes of %d", batched, takes)
	}
	t.Logf("%d coalesced writes carried %d takes", len(events.Of("sku#0", dynamoconditional.EventBatch)), batched)
}
