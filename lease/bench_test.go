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
//   - lease: Client.Acquire + Lock.Release (with renewals, Lost, token);
//   - handwritten: the seed's lease SQL inline on the pool, with its
//     token: one INSERT … ON CONFLICT … RETURNING token, one UPDATE to
//     release;
//   - advisory: pg_advisory_lock + pg_advisory_unlock on a session of a
//     dedicated connection per client (no TTL, no token, no commit).
//
// The three run in alternating blocks of pairBlock pairs, so that what
// else the machine does falls on all of them alike; b.N pairs each. It
// reports each one's pairs/s and lease's rate over the hand-written SQL's
// (x-handwritten).
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
	handOp := func(ctx context.Context, client int) error {
		key := fmt.Sprintf("bench-%d", client)
		var token int64
		err := pool.QueryRow(ctx, `INSERT INTO hand AS h (key, owner, token, expires_at)
VALUES ($1, 'worker', 1, now() + interval '60 seconds')
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = h.token + 1, expires_at = excluded.expires_at
WHERE h.expires_at < now() RETURNING token`, key).Scan(&token)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `UPDATE hand SET expires_at = now() - interval '1 microsecond' WHERE key = $1 AND token = $2`, key, token)
		return err
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
	names := []string{"lease", "handwritten", "advisory"}
	ops := []func(context.Context, int) error{leaseOp, handOp, advisoryOp}
	var took [3]time.Duration
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
}

// pairBlock is how many pairs each variant runs before the next one's turn.
const pairBlock = 200
