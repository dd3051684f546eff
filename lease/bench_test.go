package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

const benchClients = 4

// BenchmarkPairs measures acquire + release pairs per second, each client
// on its own key (uncontended), in the same run for:
//   - lease: Client.Acquire + Lock.Release (with renewals, Lost, token);
//   - advisory: pg_advisory_lock + pg_advisory_unlock on a session of a
//     dedicated connection per client (no TTL, no token);
//   - handwritten: the seed's lease SQL inline on the pool, with its
//     token: one INSERT … ON CONFLICT … RETURNING token, one UPDATE to
//     release.
func BenchmarkPairs(b *testing.B) {
	pool, _ := testenv.PostgresSchema(b, benchClients+2)
	ctx := context.Background()
	b.Run("lease", func(b *testing.B) {
		c := newClient(b, pool, lease.WithLease(time.Minute))
		testenv.RunClients(b, benchClients, "pairs", func(ctx context.Context, client int) error {
			l, err := c.Acquire(ctx, fmt.Sprintf("bench-%d", client))
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	})
	b.Run("advisory", func(b *testing.B) {
		conns := make([]*pgxpool.Conn, benchClients)
		for i := range conns {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Release()
			conns[i] = conn
		}
		testenv.RunClients(b, benchClients, "pairs", func(ctx context.Context, client int) error {
			if _, err := conns[client].Exec(ctx, "SELECT pg_advisory_lock($1)", int64(client)); err != nil {
				return err
			}
			_, err := conns[client].Exec(ctx, "SELECT pg_advisory_unlock($1)", int64(client))
			return err
		})
	})
	b.Run("handwritten", func(b *testing.B) {
		if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS hand (key text PRIMARY KEY, owner text NOT NULL,
token bigint NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
			b.Fatal(err)
		}
		testenv.RunClients(b, benchClients, "pairs", func(ctx context.Context, client int) error {
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
		})
	})
}
