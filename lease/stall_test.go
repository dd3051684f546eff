package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/observe"
)

// One Client holding many locks keeps them all through a pause of
// PostgreSQL (every process of a server of the test's own stopped with
// SIGSTOP) shorter than the lease minus a heartbeat, and loses them all,
// as expiries, in one longer than the lease (testenv.StallTrial; a lock
// that expires before the pause, its renewal unanswered, makes the trial
// inconclusive: another runs on fresh locks; so do locks that expire so in
// the short pause when a statement sent on a connection of its own right
// after the resume waited longer than a heartbeat for its answer).
func TestManyLocksServerPaused(t *testing.T) {
	t.Parallel()
	stallTrial(t, 100)
}

// The same with 1,000 locks.
func TestThousandLocksServerPaused(t *testing.T) {
	t.Parallel()
	stallTrial(t, 1000)
}

func stallTrial(t *testing.T, n int) {
	srv := testenv.PostgresServer(t)
	pool := testenv.Pool(t, srv.DSN(), 4)
	hb := testenv.Scale(500 * time.Millisecond)
	var ev testenv.Events
	c := newClient(t, pool, lease.WithLease(4*hb), lease.WithHeartbeat(hb), lease.WithObserver(observe.Func(ev.Observe)))
	prober := testenv.Pool(t, srv.DSN(), 1) // a connection of its own
	testenv.StallTrial(t, testenv.Stall{
		Name: fmt.Sprintf("lease PostgreSQL server (%d locks)", n),
		Hold: func(trial int) []testenv.HeldLock {
			return testenv.Held(holdMany(t, c, fmt.Sprintf("stall%d", trial), n))
		},
		Lease: 4 * hb, Heartbeat: hb,
		Pause: srv.Pause, Resume: srv.Resume,
		Probe: func(ctx context.Context) error {
			_, err := prober.Exec(ctx, "SELECT 1")
			return err
		},
		Valid:   func(l testenv.HeldLock) time.Time { return l.(*lease.Lock).ValidUntil() },
		Renewed: func(key string) int { return len(ev.Of(key, lease.EventRenewed)) },
		Stored: func(l testenv.HeldLock) error {
			if row := readRow(t, pool, l.Key()); row.Token != l.Token() || row.Released || row.Owner != c.Owner() {
				return fmt.Errorf("the row carries %+v", row)
			}
			return nil
		},
		Expired: func(err error) bool {
			var lost *lease.LostError
			return errors.As(err, &lost) && lost.Cause == lease.Expired
		},
	})
}
