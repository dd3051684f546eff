package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/services"
)

// RunClients runs b.N operations spread over clients goroutines, each
// calling op with its client number, and reports the rate as unit/s and
// the 99th-percentile latency as p99-ms. The first error stops the run.
// The loop itself is services.RunClients, which `nolock bench` shares.
func RunClients(b *testing.B, clients int, unit string, op func(ctx context.Context, client int) error) {
	b.ResetTimer()
	r, err := services.RunClients(context.Background(), clients, int64(b.N), 0, op)
	b.StopTimer()
	if err != nil {
		b.Error(err)
	}
	b.ReportMetric(float64(b.N)/r.Took.Seconds(), unit+"/s")
	if r.Ops > 0 {
		b.ReportMetric(float64(r.P99)/float64(time.Millisecond), "p99-ms")
	}
}
