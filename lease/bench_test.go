package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

const benchClients = 4

// BenchmarkPairs measures acquire + release pairs per second, each client
// on its own key (uncontended), in the same run for:
//   - lease: Client.Acquire + Lock.Release (with renewals, Lost, token;
//     the release commits asynchronously);
//   - handwritten: the seed's lease SQL inline on the pool, with its token
//     and a heartbeat: one INSERT … ON CONFLICT … RETURNING token, a
//     goroutine that would renew the lease every third of it (it never
//     gets to, here) stopped before one UPDATE releases (synchronously);
//   - handwritten-async: the same, its release committed asynchronously
//     as lease's is (equal durability);
//   - bare: the same two statements as handwritten, without the heartbeat;
//   - advisory: pg_advisory_lock + pg_advisory_unlock on a session of a
//     dedicated connection per client (no TTL, no token, no commit).
//
// They run in alternating blocks of pairBlock pairs, so that what else the
// machine does falls on all of them alike; b.N pairs each. It reports each
// one's pairs/s and lease's rate over the hand-written lease's
// (x-handwritten), over the hand-written lease with an asynchronous
// release (x-handwritten-async) and over the bare statements' (x-bare).
func BenchmarkPairs(b *testing.B) {
	pool, _ := testenv.PostgresSchema(b, 2*benchClients+2)
	ctx := context.Background()
	c := newClient(b, pool, lease.WithLease(time.Minute))
	leaseOp := func(ctx context.Context, client int) error {
		l, err := c.Acquire(ctx, fmt.Sprintf("bench-%d", client))
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS hand (key text PRIMARY KEY, owner text NOT NULL,
token bigint NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	handOp := func(heartbeat, async bool) func(ctx context.Context, client int) error {
		release := `UPDATE hand SET expires_at = now() - interval '1 microsecond' WHERE key = $1 AND token = $2`
		if async {
			release = `UPDATE hand SET expires_at = now() - interval '1 microsecond'
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async WHERE key = $1 AND token = $2`
		}
		return func(ctx context.Context, client int) error {
			key := fmt.Sprintf("bench-%d", client)
			var token int64
			err := pool.QueryRow(ctx, `INSERT INTO hand AS h (key, owner, token, expires_at)
VALUES ($1, $2, 1, now() + interval '60 seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = h.token + 1, expires_at = excluded.expires_at
WHERE h.expires_at < now() RETURNING token`, key, handOwner).Scan(&token)
			if err != nil {
				return err
			}
			if heartbeat {
				stop := handHeartbeat(pool, key, token)
				defer stop()
			}
			_, err = pool.Exec(ctx, release, key, token)
			return err
		}
	}
	conns := make([]*pgxpool.Conn, benchClients)
	for i := range conns {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Release()
		conns[i] = conn
	}
	advisoryOp := func(ctx context.Context, client int) error {
		if _, err := conns[client].Exec(ctx, "SELECT pg_advisory_lock($1)", int64(client)); err != nil {
			return err
		}
		_, err := conns[client].Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(client))
		return err
	}
	names := []string{"lease", "handwritten", "bare", "advisory", "handwritten-async"}
	ops := []func(context.Context, int) error{leaseOp, handOp(true, false), handOp(false, false), advisoryOp, handOp(true, true)}
	var took [5]time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; done += pairBlock {
		n := min(pairBlock, b.N-done)
		for i, op := range ops {
			r, err := services.RunClients(ctx, benchClients, int64(n), 0, op)
			if err != nil {
				b.Fatalf("%s: %v", names[i], err)
			}
			took[i] += r.Took
		}
	}
	b.StopTimer()
	for i, name := range names {
		b.ReportMetric(float64(b.N)/took[i].Seconds(), name+"-pairs/s")
	}
	b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "x-handwritten")
	b.ReportMetric(took[2].Seconds()/took[0].Seconds(), "x-bare")
	b.ReportMetric(took[4].Seconds()/took[0].Seconds(), "x-handwritten-async")
}

// handHeartbeat starts the hand-written lease's heartbeat: a goroutine
// that renews the lease every 20 s while token holds it. The returned
// function stops it and waits for it to end, before the release.
func handHeartbeat(pool *pgxpool.Pool, key string, token int64) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				_, _ = pool.Exec(context.Background(), `UPDATE hand SET expires_at = now() + interval '60 seconds'
WHERE key = $1 AND token = $2 AND expires_at > now()`, key, token)
			}
		}
	}()
	return func() { close(quit); <-done }
}

// handOwner names the hand-written lease's holder, as lease's owner does.
const handOwner = "4f1c2a0e-6f0b-4d47-9b57-2f1e8d3c5a71"

// pairBlock is how many pairs each variant runs before the next one's turn.
const pairBlock = 200
