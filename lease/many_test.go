package lease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// renewals wraps a DB and records how many locks each renewal statement
// carried (the length of its array of keys).
type renewals struct {
	lease.DB
	mu    sync.Mutex
	sizes []int
}

func (r *renewals) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if kind(sql) == "renew" {
		for _, a := range args {
			if keys, ok := a.([]string); ok {
				r.mu.Lock()
				r.sizes = append(r.sizes, len(keys))
				r.mu.Unlock()
				break
			}
		}
	}
	return r.DB.QueryRow(ctx, sql, args...)
}

// since returns the sizes recorded from the i-th statement on.
func (r *renewals) since(i int) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.sizes[min(i, len(r.sizes)):]...)
}

// holdMany acquires n locks on c (keys prefix-0 …) and returns them.
func holdMany(t testing.TB, c *lease.Client, prefix string, n int) []*lease.Lock {
	t.Helper()
	locks := make([]*lease.Lock, n)
	for i := range locks {
		l, err := c.TryAcquire(context.Background(), fmt.Sprintf("%s-%d", prefix, i))
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
		locks[i] = l
	}
	return locks
}

// One Client holding many locks renews them all with one statement per
// heartbeat: once the locks have met in one renewal, every renewal
// statement carries all of them, whatever the machine's load (a late tick
// is late for all of them alike), and none is lost.
func TestManyLocksOneStatementPerTick(t *testing.T) {
	t.Parallel()
	const n = 300
	pool, _ := testenv.PostgresSchema(t, 4)
	db := &renewals{DB: pool}
	c := newClient(t, db, lease.WithLease(2*testLease))
	locks := holdMany(t, c, "many", n)
	all := func(from int) (full, partial int) {
		for _, s := range db.since(from) {
			if s == n {
				full++
			} else {
				partial++
			}
		}
		return full, partial
	}
	testenv.Until(t, "a renewal of all the locks at once", func() (bool, error) {
		full, _ := all(0)
		return full > 0, nil
	})
	var first int
	for i, s := range db.since(0) {
		if s == n {
			first = i
			break
		}
	}
	testenv.Until(t, "8 more renewals of all the locks", func() (bool, error) {
		full, _ := all(first)
		return full >= 9, nil
	})
	full, partial := all(first)
	lost := 0
	for _, l := range locks {
		if l.Err() != nil {
			lost++
		}
	}
	if partial != 0 || lost != 0 {
		t.Fatalf("after the locks met: %d renewal statements carried all %d locks, %d fewer (want 0); %d locks lost (want 0)", full, n, partial, lost)
	}
	t.Logf("%d locks: %d renewal statements before they met in one, then %d of all of them; 0 lost", n, first, full)
	for _, l := range locks {
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := readRow(t, pool, "many-7"); !got.Released {
		t.Fatalf("row after release: %+v", got)
	}
}

// BenchmarkHeldLocks reports, per count of locks one Client holds, the
// renewal statements per second it sends and the lock renewals per second
// they carry (lease 2 s, heartbeat 500 ms): one statement per heartbeat
// whatever the count. Each iteration holds the locks for one heartbeat.
func BenchmarkHeldLocks(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			pool, _ := testenv.PostgresSchema(b, 4)
			db := &renewals{DB: pool}
			hb := 500 * time.Millisecond
			c := newClient(b, db, lease.WithLease(4*hb), lease.WithHeartbeat(hb))
			locks := holdMany(b, c, strings.Repeat("b", 8), n)
			from, start := len(db.since(0)), time.Now()
			b.ResetTimer()
			for range b.N {
				time.Sleep(hb)
			}
			b.StopTimer()
			secs := time.Since(start).Seconds()
			stmts, carried := 0, 0
			for _, s := range db.since(from) {
				stmts++
				carried += s
			}
			lost := 0
			for _, l := range locks {
				if l.Err() != nil {
					lost++
				}
			}
			b.ReportMetric(float64(n), "locks")
			b.ReportMetric(float64(stmts)/secs, "statements/s")
			b.ReportMetric(float64(carried)/secs, "renewals/s")
			b.ReportMetric(float64(lost), "lost")
		})
	}
}
