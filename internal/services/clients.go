package services

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Run is what RunClients measured: Ops operations completed in Took, their
// rate per second and their 99th-percentile latency.
type Run struct {
	Ops  int64
	Took time.Duration
	Rate float64
	P99  time.Duration
}

// RunClients calls op from clients goroutines, each passing its client
// number (0 to clients-1), until limit operations have started (limit > 0)
// or until d has passed (d > 0; operations in flight then finish and
// count), whichever comes first; with neither it returns an error at once.
// The first error op returns, or ctx's cancellation, stops every client and
// is returned with what was measured up to then. RunClients owns its
// goroutines: they have all returned when it does.
func RunClients(ctx context.Context, clients int, limit int64, d time.Duration, op func(ctx context.Context, client int) error) (Run, error) {
	if clients < 1 || (limit <= 0 && d <= 0) {
		return Run{}, errors.New("services: RunClients needs clients >= 1 and a limit or a duration")
	}
	var (
		next    atomic.Int64
		stopped atomic.Bool
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	fail := func(err error) {
		errOnce.Do(func() { first = err })
		stopped.Store(true)
	}
	lat := make([][]time.Duration, clients)
	start := time.Now()
	deadline := start.Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stopped.Load() {
				if limit > 0 && next.Add(1) > limit {
					return
				}
				if d > 0 && !time.Now().Before(deadline) {
					return
				}
				if err := ctx.Err(); err != nil {
					fail(err)
					return
				}
				t0 := time.Now()
				if err := op(ctx, c); err != nil {
					fail(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	r := Run{Took: time.Since(start)}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r.Ops = int64(len(all))
	if r.Took > 0 {
		r.Rate = float64(r.Ops) / r.Took.Seconds()
	}
	if len(all) > 0 {
		r.P99 = all[len(all)*99/100]
	}
	return r, first
}
