package conditional_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// slowStockCommits puts key's rows in the stock table (qty per bucket),
// then holds the commit of every later change to the table's rows in a
// deferred trigger until the test calls disarm; reached counts the commits
// that reached the trigger.
func slowStockCommits(t *testing.T, pool *pgxpool.Pool, key string, qty ...int64) (reached func() int64, disarm func()) {
	t.Helper()
	for b, q := range qty {
		if _, err := pool.Exec(context.Background(), `INSERT INTO nolock_stock (key, bucket, qty) VALUES ($1, $2, $3)`, key, b, q); err != nil {
			t.Fatal(err)
		}
	}
	mustExec(t, pool, `CREATE TABLE fault (armed boolean NOT NULL)`)
	mustExec(t, pool, `INSERT INTO fault VALUES (true)`)
	mustExec(t, pool, `CREATE SEQUENCE commit_reached`)
	mustExec(t, pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('commit_reached');
  WHILE (SELECT armed FROM fault) LOOP PERFORM pg_sleep(0.01); END LOOP;
  RETURN NULL;
END $$`)
	mustExec(t, pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON nolock_stock
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	disarmed := false
	disarm = func() {
		if !disarmed {
			disarmed = true
			mustExec(t, pool, `UPDATE fault SET armed = false`)
		}
	}
	t.Cleanup(disarm) // before the Stock's Close, which waits for the commit
	reached = func() int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM commit_reached`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return reached, disarm
}

// A take whose commit is in flight stops waiting when its ctx ends (a take
// across buckets, or the only take of a batch at the home bucket that
// steals from the others) and reports ErrAmbiguousCommit; the commit is
// not cancelled, runs on to its end, and the Stock's Close waits for it.
func TestStockCommitOutlivesItsWait(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []conditional.Option
		qty  []int64 // per bucket
	}{
		{"across buckets", []conditional.Option{conditional.WithBuckets(2)}, []int64{2, 2}},
		{"home steals", []conditional.Option{conditional.WithBuckets(2), conditional.WithHome(0)}, []int64{0, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testenv.Postgres(t)
			s := newStock(t, pool, tc.opts...)
			reached, disarm := slowStockCommits(t, pool, "sku", tc.qty...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- s.Take(ctx, "sku", 3) }()
			testenv.Until(t, "the take's commit reaches the trigger", func() (bool, error) { return reached() > 0, nil })
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, conditional.ErrAmbiguousCommit) {
					t.Fatalf("Take whose wait ended during its commit: %v; want ErrAmbiguousCommit", err)
				}
			case <-time.After(testenv.Scale(time.Minute)): // a guard against a hang, not a measure
				t.Fatal("Take still waits for its commit after its wait ended")
			}
			closed := make(chan struct{})
			go func() { _ = s.Close(); close(closed) }()
			reached() // a round trip: time for a Close that did not wait to return
			select {
			case <-closed:
				t.Fatal("Close returned while the take's commit was held in its trigger")
			default:
			}
			disarm()
			<-closed
			var left int64
			if err := pool.QueryRow(context.Background(), `SELECT sum(qty) FROM nolock_stock WHERE key = 'sku'`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			var total int64
			for _, q := range tc.qty {
				total += q
			}
			if left != total-3 {
				t.Fatalf("%d units left after Close, want %d: the commit had not ended", left, total-3)
			}
		})
	}
}
