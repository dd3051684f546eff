package pgerr_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/testenv"
)

// A statement whose caller's context ends while it waits for a pool's
// connection sent nothing: Exec and Row report NotSent, never Unknown,
// and nothing ran.
func TestAcquireWaitEndedIsNotSent(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 1)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	held, err := pool.Acquire(ctx) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	var c pgerr.Committer
	defer c.Close()
	for name, write := range map[string]func(context.Context) error{
		"Exec": func(ctx context.Context) error {
			_, err := c.Exec(ctx, pool, `INSERT INTO t VALUES (1)`)
			return err
		},
		"Row": func(ctx context.Context) error {
			return c.Row(ctx, pool, `INSERT INTO t VALUES (2) RETURNING n`).Scan(new(int))
		},
	} {
		for _, end := range []string{"deadline", "cancel"} {
			wctx, cancel := context.WithTimeout(ctx, testenv.Scale(20*time.Millisecond))
			if end == "cancel" {
				cancel()
			}
			err := write(wctx)
			cancel()
			if got := pgerr.Of(err); got != pgerr.NotSent || !errors.Is(err, wctx.Err()) {
				t.Errorf("%s, %s while waiting for a connection: %v (%v); want NotSent wrapping %v", name, end, err, got, wctx.Err())
			}
		}
	}
	held.Release()
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows (%v): a statement that never had a connection ran", n, err)
	}
}

// Bound cuts a statement still unanswered at its deadline (Unknown, the
// connection closed), and the function it returns clears the deadline.
func TestBoundCutsAtItsDeadlineAndClears(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t, 2) // one for the statement, one to watch it
	ctx := context.Background()
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	d := testenv.Scale(100 * time.Millisecond)
	pgerr.BoundFor(c.Conn().PgConn(), d)()
	if _, err := c.Exec(ctx, `SELECT pg_sleep($1)`, 2*d.Seconds()); err != nil {
		t.Fatalf("a statement after the deadline was cleared: %v", err)
	}
	// The deadline is set once the statement runs, so that it cuts the
	// wait for the answer however slow the machine is.
	pid := c.Conn().PgConn().PID()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, `SELECT pg_sleep($1)`, 30*d.Seconds())
		done <- err
	}()
	testenv.Until(t, "the statement runs", func() (bool, error) {
		var running bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep%' AND state = 'active')`, pid).Scan(&running)
		return running, err
	})
	pgerr.BoundFor(c.Conn().PgConn(), d)
	err = <-done
	if pgerr.Of(err) != pgerr.Unknown || !c.Conn().IsClosed() {
		t.Fatalf("a statement past the deadline: %v (outcome %v, connection closed %v); want it cut, Unknown, closed", err, pgerr.Of(err), c.Conn().IsClosed())
	}
}
