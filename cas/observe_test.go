package cas_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Retry reports a lost compare-and-set, the retry and the commit; with no
// attempts left, the give-up. A Store reports its write with its key.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	mustExec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, version bigint NOT NULL)`)
	mustExec(t, pool, `INSERT INTO docs VALUES (1, '', 1)`)
	// edit loses its first attempt to another writer, if lose says so.
	edit := func(lose bool) func(ctx context.Context, tx pgx.Tx) error {
		first := true
		return func(ctx context.Context, tx pgx.Tx) error {
			var version int64
			if err := tx.QueryRow(ctx, `SELECT version FROM docs WHERE id = 1`).Scan(&version); err != nil {
				return err
			}
			if first && lose {
				mustExec(t, pool, `UPDATE docs SET version = version + 1 WHERE id = 1`)
			}
			first = false
			return pgcas.Exec(ctx, tx, `UPDATE docs SET body = 'x', version = version + 1 WHERE id = 1 AND version = $1`, version)
		}
	}
	events := &testenv.Events{}
	if err := pgcas.Retry(ctx, pool, edit(true), cas.WithObserver(observe.Func(events.Observe))); err != nil {
		t.Fatal(err)
	}
	if got, want := events.Names(""), []string{"cas.conflict", "cas.retry", "cas.committed"}; !slices.Equal(got, want) {
		t.Errorf("a Retry that lost once: %v, want %v", got, want)
	}
	gaveUp := &testenv.Events{}
	err := pgcas.Retry(ctx, pool, edit(true), cas.WithAttempts(1), cas.WithObserver(observe.Func(gaveUp.Observe)))
	if !errors.Is(err, cas.ErrConflict) {
		t.Fatalf("Retry with one attempt that lost: %v, want ErrConflict", err)
	}
	if got, want := gaveUp.Names(""), []string{"cas.conflict", "cas.gave_up"}; !slices.Equal(got, want) {
		t.Errorf("a Retry out of attempts: %v, want %v", got, want)
	}
	if errs := gaveUp.Errs("", "cas.gave_up"); len(errs) != 1 || !errors.Is(errs[0], cas.ErrConflict) {
		t.Errorf("gave_up's error: %v, want ErrConflict", errs)
	}

	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	storeEvents := &testenv.Events{}
	s, err := cas.NewStore[int](b, nil, cas.WithObserver(observe.Func(storeEvents.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, "k", func(v int) (int, error) { return v + 1, nil }); err != nil {
		t.Fatal(err)
	}
	s.Close() // the Store's events come from its own goroutine: Close delivers them all
	// The call's End and the write's event (from the Store's queue) are
	// not ordered with one another.
	if got, want := slices.Sorted(slices.Values(storeEvents.Names("k"))), []string{"cas.committed", "cas.updated"}; !slices.Equal(got, want) {
		t.Errorf("a Store's Update: %v, want %v in any order", got, want)
	}
}
