package main

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Two replicas as processes, on PostgreSQL directly and behind PgBouncer:
// one leads and sends pages; SIGTERM lets its page in flight commit,
// releases the lease and exits 0; the other takes over with a higher token
// long before the 10-minute lease could run out (only the release lets
// it), and carries on. Every page is sent once, in order, with tokens that
// never go down.
func TestLeaderService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DATABASE_URL")
	for _, d := range servicetest.Deployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema (and topic)
			testLeader(t, bin, d)
		})
	}
}

func testLeader(t *testing.T, bin string, d servicetest.Deployment) {
	pool, schema := testenv.PostgresSchema(t, 2)
	env := []string{"DATABASE_URL=" + d.DSN(t, schema), "JOB_INTERVAL=20ms", "LEASE=10m"}
	a := servicetest.Start(t, bin, env...)
	testenv.Until(t, "a leads and sends pages", func() (bool, error) {
		l := a.Leader()
		return l.Leader && l.Steps >= 3, nil
	})
	b := servicetest.Start(t, bin, env...)
	first := a.Leader()
	if l := b.Leader(); l.Leader {
		t.Fatalf("both lead: %+v and %+v", first, l)
	}
	a.WaitMetrics(`nolock_lock_wait_duration_seconds_count{nolock_call="lease.acquire",nolock_event="lease.acquired"} 1`, `nolock_operation_duration_seconds_count{nolock_call="conditional.update",nolock_event="conditional.written"}`)

	// a's page in flight at SIGTERM waits for the cursor's row, locked here.
	a.StopWhileLocked(pool, `SELECT FROM job_cursor FOR UPDATE`, func() {})
	var second service.LeaderStatus
	testenv.Until(t, "b takes over", func() (bool, error) {
		second = b.Leader()
		return second.Leader && second.Steps >= 3, nil
	})
	if second.Token <= first.Token {
		t.Fatalf("b leads with token %d, not above a's %d", second.Token, first.Token)
	}
	b.Stop()

	var pages, distinct, inOrder, next int64
	if err := pool.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT page),
  count(*) FILTER (WHERE page = rn - 1 AND token >= prev), (SELECT next_page FROM job_cursor)
FROM (SELECT page, token, row_number() OVER (ORDER BY page) AS rn, lag(token, 1, 0) OVER (ORDER BY page) AS prev FROM job_pages) x`).
		Scan(&pages, &distinct, &inOrder, &next); err != nil {
		t.Fatal(err)
	}
	if pages != next || distinct != next || inOrder != next {
		t.Fatalf("%d pages recorded, %d distinct, %d in order with tokens not going down; the cursor is at %d", pages, distinct, inOrder, next)
	}
}
