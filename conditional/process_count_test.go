package conditional_test

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// saleCount is a pgx tracer on a sale process's pool: from the start
// signal on (on), it counts the process's statements, each a round trip
// (BEGIN and COMMIT included), and of them the locks of all a key's
// buckets (a steal, or a take across buckets: the tail of a sale with
// homes), with the time of the first.
type saleCount struct {
	on          atomic.Bool
	stmts       atomic.Int64
	across      atomic.Int64
	firstAcross atomic.Int64 // Unix nanoseconds; 0: none yet
}

func (c *saleCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !c.on.Load() {
		return ctx
	}
	c.stmts.Add(1)
	if strings.HasSuffix(d.SQL, "ORDER BY bucket FOR UPDATE") && c.across.Add(1) == 1 {
		c.firstAcross.Store(time.Now().UnixNano())
	}
	return ctx
}

func (*saleCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// cpuTime returns the CPU time (user and system) this process has used.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
