package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: the DynamoDB-API server (a dynalite of the test's own, its tables
// on disk) is killed and restarted on the same endpoint, several times,
// while 8 buyers take one unit at a time from Stocks of 2 buckets,
// each buyer from a key of its own (so the test knows what each take did),
// retrying every error after a pause until its key is sold out.
//
// Every answer is checked against the key: success means the unit was
// taken; an error other than ErrAmbiguousCommit means it was not (a take
// that finds the server down is refused the connection, which the SDK
// retries while its attempts last); ErrAmbiguousCommit (a request the kill
// cut off, or sent on a connection that died with the server) may go
// either way, and the buyer reads the key to learn which. At the end every
// key is sold out, its units granted exactly once: none lost, none
// granted twice.
func TestDynamoStockServerRestart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(5*time.Minute))
	defer cancel()
	srv := testenv.DynamoDBServer(t)
	client := srv.Client()
	table := testenv.Table(t, client, false)
	s := newDynamoStock(t, client, table, 2)
	const buyers = 8
	restarts := testenv.Trials(2, 20)
	units := int64(10 * (restarts + 1))
	for b := 0; b < buyers; b++ {
		if err := s.Put(ctx, fmt.Sprint("sku-", b), units); err != nil {
			t.Fatal(err)
		}
	}
	// available reads a key, retrying while the server is down.
	available := func(key string) (int64, error) {
		for {
			n, err := s.Available(ctx, key)
			if err == nil || ctx.Err() != nil {
				return n, err
			}
			time.Sleep(20 * time.Millisecond) // until the server is back
		}
	}

	var sold, ok, unknownApplied, unknownNot, refused atomic.Int64
	var wg sync.WaitGroup
	for b := 0; b < buyers; b++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, left := fmt.Sprint("sku-", b), units
			for {
				err := s.Take(ctx, key, 1)
				switch {
				case errors.Is(err, dynamoconditional.ErrSoldOut):
					if n, err := available(key); err != nil || n != 0 || left != 0 {
						t.Errorf("%s: sold out with %d units left by the buyer's count, %d by the server's (%v)", key, left, n, err)
					}
					return
				case ctx.Err() != nil:
					t.Errorf("%s: %v (last answer %v)", key, ctx.Err(), err)
					return
				case err == nil:
					ok.Add(1)
					sold.Add(1)
					left--
					continue
				}
				n, rerr := available(key)
				switch {
				case rerr != nil:
					t.Errorf("%s: %v", key, rerr)
					return
				case errors.Is(err, dynamoconditional.ErrAmbiguousCommit) && n == left-1:
					unknownApplied.Add(1)
					sold.Add(1)
					left--
				case errors.Is(err, dynamoconditional.ErrAmbiguousCommit) && n == left:
					unknownNot.Add(1)
				case n == left:
					refused.Add(1)
				default:
					t.Errorf("%s: told %v with %d units left; the server holds %d", key, err, left, n)
					return
				}
				time.Sleep(10 * time.Millisecond) // the buyer's pause before it retries
			}
		}()
	}
	total := int64(buyers) * units
	for r := 1; r <= restarts && !t.Failed(); r++ {
		testenv.Until(t, fmt.Sprintf("a %d/%d of the units are sold", r, restarts+1), func() (bool, error) {
			return sold.Load() >= total*int64(r)/int64(restarts+1) || t.Failed(), nil
		})
		srv.KillFor(testenv.Scale(200 * time.Millisecond))
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if sold.Load() != total {
		t.Fatalf("%d units granted, want %d", sold.Load(), total)
	}
	// Only a take in flight at a kill, or one more sent on a connection
	// that died with the server, can be ambiguous: a take that found the
	// server down was refused the connection, and knows it sent nothing.
	if amb := unknownApplied.Load() + unknownNot.Load(); amb > int64(2*buyers*restarts) {
		t.Fatalf("%d takes ambiguous across %d restarts, more than the %d that can have been in flight", amb, restarts, 2*buyers*restarts)
	}
	testenv.Figures(t, "dynamoconditional.Stock server restart", "%d restarts (SIGKILL, down %v), %d units over %d keys: takes told success %d (all taken), ErrAmbiguousCommit %d (taken %d, not %d), an error that proves nothing was taken %d (none taken); 0 units lost, 0 granted twice",
		restarts, testenv.Scale(200*time.Millisecond), total, buyers, ok.Load(), unknownApplied.Load()+unknownNot.Load(), unknownApplied.Load(), unknownNot.Load(), refused.Load())
}
