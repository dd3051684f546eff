package testenv_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/internal/testenv"
)

// syncRepWaiters counts the sessions on dsn's server whose COMMIT waits
// for the synchronous standby.
func syncRepWaiters(t *testing.T, dsn string) func() (bool, error) {
	return func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(10*time.Second))
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		var n int
		err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n)
		return n > 0, err
	}
}

// ids returns the ids in table pay, in order, through db.
func ids(ctx context.Context, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]int, error) {
	rows, err := db.Query(ctx, "SELECT id FROM pay ORDER BY id")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int])
}

// standbyHas waits until the standby has replayed every id in want.
func standbyHas(t *testing.T, pair *testenv.PGPair, schema string, want []int) {
	t.Helper()
	ctx := context.Background()
	testenv.Until(t, fmt.Sprintf("the standby shows ids %v", want), func() (bool, error) {
		conn, err := pgx.Connect(ctx, pair.StandbyDSN())
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		rows, err := conn.Query(ctx, "SELECT id FROM "+pgx.Identifier{schema, "pay"}.Sanitize()+" ORDER BY id")
		if err != nil {
			return false, err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int])
		return slices.Equal(got, want), err
	})
}

// TestPairStallFailoverRebuild: a COMMIT waits for the synchronous standby
// while it is stalled and returns once it resumes; a commit left waiting
// when the primary dies is lost on the promoted standby, every
// acknowledged one survives, and the multi-host DSN reaches the new
// primary; the old primary rebuilt as a standby is in sync again.
func TestPairStallFailoverRebuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testenv.PostgresPair(t)
	schema := pair.CreateSchema()
	pool := testenv.Pool(t, pair.DSNFor(schema), 4)
	if _, err := pool.Exec(ctx, "CREATE TABLE pay (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	standbyHas(t, pair, schema, []int{1})

	// Stalled: the commit waits (SyncRep) until the standby resumes.
	pair.StallStandby()
	done := make(chan error, 1)
	go func() { _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (2)"); done <- err }()
	testenv.Until(t, "a commit waits for the stalled standby", syncRepWaiters(t, pair.PrimaryDSN()))
	select {
	case err := <-done:
		t.Fatalf("the commit returned (%v) while the standby was stalled", err)
	default:
	}
	pair.ResumeStandby()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the commit after resume: %v", err)
		}
	case <-time.After(testenv.Scale(time.Minute)):
		t.Fatal("the commit still waits after the standby resumed")
	}
	standbyHas(t, pair, schema, []int{1, 2})

	// Stalled again, the primary dies with a commit waiting: that commit
	// was never acknowledged, and the promoted standby never got it.
	pair.StallStandby()
	go func() { _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (3)"); done <- err }()
	testenv.Until(t, "a commit waits for the stalled standby", syncRepWaiters(t, pair.PrimaryDSN()))
	old := pair.PrimaryDSN()
	pair.KillPrimary()
	if err := <-done; err == nil {
		t.Fatal("the commit waiting when the primary died was acknowledged")
	} else {
		t.Logf("the commit waiting when the primary died: %v", err)
	}
	pair.Promote()
	if pair.PrimaryDSN() == old || pair.StandbyDSN() != "" {
		t.Fatalf("after Promote: primary %s (was %s), standby %q", pair.PrimaryDSN(), old, pair.StandbyDSN())
	}
	var got []int
	testenv.Until(t, "the pool reaches the promoted standby", func() (bool, error) {
		var err error
		got, err = ids(ctx, pool)
		return err == nil, nil
	})
	if !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("ids on the new primary = %v; want [1 2] (1 and 2 acknowledged, 3 never)", got)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (4)"); err != nil {
		t.Fatalf("write on the new primary, which has no standby to wait for: %v", err)
	}

	// The old primary, rebuilt, is the new primary's synchronous standby.
	pair.Rebuild()
	if _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (5)"); err != nil {
		t.Fatal(err)
	}
	standbyHas(t, pair, schema, []int{1, 2, 4, 5})
	pair.StallStandby()
	go func() { _, err := pool.Exec(ctx, "INSERT INTO pay VALUES (6)"); done <- err }()
	testenv.Until(t, "a commit waits for the rebuilt, stalled standby", syncRepWaiters(t, pair.PrimaryDSN()))
	pair.ResumeStandby()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPairBehindPgBouncer: a private PgBouncer in front of the primary,
// moved to the promoted standby after a failover, serves the rows every
// acknowledged commit wrote.
func TestPairBehindPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := testenv.PostgresPair(t)
	schema := pair.CreateSchema()
	bouncer := testenv.PgBouncerServer(t, pair.PrimaryDSN())
	pool := testenv.PoolMode(t, bouncer.DSNFor(schema), pgx.QueryExecModeExec, 4)
	if _, err := pool.Exec(ctx, "CREATE TABLE pay (id int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 3; id++ {
		if _, err := pool.Exec(ctx, "INSERT INTO pay VALUES ($1)", id); err != nil {
			t.Fatal(err)
		}
	}
	pair.KillPrimary()
	pair.Promote()
	bouncer.Retarget(pair.PrimaryDSN())
	got := untilIDs(t, pool)
	if !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("ids through PgBouncer after the failover = %v; want [1 2 3]", got)
	}
}

// untilIDs polls the ids in pay through pool until a query succeeds.
func untilIDs(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	var got []int
	testenv.Until(t, "a query through the pool succeeds", func() (bool, error) {
		var err error
		got, err = ids(context.Background(), pool)
		return err == nil, nil
	})
	return got
}
