package lease_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
)

// The batched renewal (arrays of keys and tokens in, arrays out) and its
// read-back work in every pgx query mode, directly and through PgBouncer's
// transaction pooling: three locks renew together, a renewal whose answer
// is lost is resolved by reading the rows back, and none is lost.
func TestBatchedRenewalModes(t *testing.T) {
	t.Parallel()
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, mode := range modes {
			t.Run(fmt.Sprintf("%s/%v", via, mode), func(t *testing.T) {
				t.Parallel()
				_, schema := testenv.PostgresSchema(t, 2)
				dsn := testenv.PostgresDSNFor(t, schema)
				if via == "pgbouncer" {
					dsn = testenv.PgBouncerDSNFor(t, schema)
				}
				pool := testenv.PoolMode(t, dsn, mode, 4)
				faults := newFaultDB(pool)
				db := &renewals{DB: faults}
				// A wrapper hides its pool's mode (docs/deploying.md); this
				// one shows it, as the pool would, so the Client learns that
				// PgBouncer drops named statements, as it does on the pool.
				c := newClient(t, showsMode{db, pool.Config()}, lease.WithHeartbeat(testLease/8))
				locks := holdMany(t, c, "m", 3)
				testenv.Until(t, "two renewals of the three locks", func() (bool, error) {
					full := 0
					for _, s := range db.since(0) {
						if s == 3 {
							full++
						}
					}
					return full >= 2, nil
				})
				faults.set(func(f *faultDB) { f.lose["renew"] = 1 })
				from := len(db.since(0))
				testenv.Until(t, "two renewals after the lost answer", func() (bool, error) {
					return len(db.since(from)) >= 3, nil
				})
				faults.set(func(f *faultDB) {
					if f.lose["renew"] != 0 {
						t.Fatal("no renewal answer was lost: the test tested nothing")
					}
				})
				for i, l := range locks {
					if err := l.Err(); err != nil {
						t.Fatalf("lock %d: %v", i, err)
					}
					if err := l.Release(context.Background()); err != nil {
						t.Fatalf("release %d: %v", i, err)
					}
				}
			})
		}
	}
}

// showsMode is a DB wrapper that shows the configuration of the pool it
// wraps, as a *pgxpool.Pool does.
type showsMode struct {
	lease.DB
	cfg *pgxpool.Config
}

func (s showsMode) Config() *pgxpool.Config { return s.cfg }
