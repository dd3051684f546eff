package testenv

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// RunClients runs b.N operations spread over clients goroutines, each
// calling op with its client number, and reports the rate as unit/s and
// the 99th-percentile latency as p99-ms. The first error stops the run.
func RunClients(b *testing.B, clients int, unit string, op func(ctx context.Context, client int) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	lat := make([][]time.Duration, clients)
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := op(ctx, c); err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/took.Seconds(), unit+"/s")
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100])/float64(time.Millisecond), "p99-ms")
	}
}
