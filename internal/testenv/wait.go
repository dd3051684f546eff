package testenv

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Slowdown is the factor by which tests stretch leases, timeouts and waits:
// 4 under the race detector (which slows code 2-10x), times
// NOLOCK_TEST_SLOW if that is set to a number above 1, times the machine's
// load beyond what one suite puts on it (see load).
func Slowdown() float64 {
	f := load
	if raceDetector {
		f *= 4
	}
	if v, err := strconv.ParseFloat(os.Getenv("NOLOCK_TEST_SLOW"), 64); err == nil && v > 1 {
		f *= v
	}
	return f
}

// load is the machine's 1-minute load average, when the test binary
// started, over 8 runnable tasks a core (what the suite alone reaches,
// scripts/test running four packages of eight tests at once), if above
// 1, at most 8. A server that other suites starve answers later, and a
// lock's promise (held while its renewals are answered within the lease)
// then needs a longer lease.
var load = func() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 1
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 1
	}
	avg, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 1
	}
	return min(max(avg/float64(8*runtime.NumCPU()), 1), 8)
}()

// Scale stretches d by Slowdown: use it for every lease and timeout a test
// sets, so the test checks the algorithm and not the machine's speed.
func Scale(d time.Duration) time.Duration { return time.Duration(float64(d) * Slowdown()) }

// Until polls cond every 10 ms until it reports true and returns; it fails
// the test if cond returns an error or has not held within a minute
// (scaled). It is a probe: it orders a test's steps by an observed state,
// never by the time a step is expected to take.
func Until(t testing.TB, what string, cond func() (bool, error)) {
	t.Helper()
	if err := Poll(what, cond); err != nil {
		t.Fatal(err)
	}
}

// Querier is what LockWaiters needs: a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// lockWaitersSQL counts the sessions of db's application_name (each test's
// schema, see PostgresDSNFor) that wait for a heavyweight lock: a row lock,
// a transaction ID, a unique-index insert.
const lockWaitersSQL = `SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND application_name = current_setting('application_name')`

// WaitLockWaiters waits until at least n sessions of this test's schema
// wait for a lock: the probe for "sent and blocked on the row lock".
func WaitLockWaiters(t testing.TB, db Querier, n int) {
	t.Helper()
	Until(t, strconv.Itoa(n)+" sessions wait for a lock", func() (bool, error) {
		var waiting int
		err := db.QueryRow(context.Background(), lockWaitersSQL).Scan(&waiting)
		return waiting >= n, err
	})
}

// Race reports whether the tests run with the race detector, so a test
// that builds a binary can build it the same way.
func Race() bool { return raceDetector }
