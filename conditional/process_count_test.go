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
// homes), with the time of the first; and, for a process at a home other
// than bucket 0, when it first sent a statement for bucket 0: after the
// endgame gathered the key there (see WithEndgame).
type saleCount struct {
	home          int // the process's WithHome; -1: none
	on            atomic.Bool
	stmts         atomic.Int64
	across        atomic.Int64
	firstAcross   atomic.Int64 // Unix nanoseconds; 0: none yet
	firstGathered atomic.Int64 // Unix nanoseconds; 0: none yet, or home 0 or none
}

func (c *saleCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !c.on.Load() {
		return ctx
	}
	c.stmts.Add(1)
	if strings.HasSuffix(d.SQL, "ORDER BY bucket FOR UPDATE") && c.across.Add(1) == 1 {
		c.firstAcross.Store(time.Now().UnixNano())
	}
	if c.home > 0 && len(d.Args) >= 2 && d.Args[1] == any(0) { // (key, bucket, …): a take or a read of bucket 0
		c.firstGathered.CompareAndSwap(0, time.Now().UnixNano())
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
