package cas_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// Retry and a Store's Update are calls: op gets the context Start
// returned, and End gets it once, with the outcome, for a commit, a
// give-up, op's error, op's panic, a cancelled ctx and bad input alike.
func TestCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := &testenv.Calls{}
	obs := cas.WithObserver(calls)
	var inOp int
	op := func(err error) func(context.Context) error {
		return func(ctx context.Context) error {
			if _, ok := testenv.CallOf(ctx); ok {
				inOp++
			}
			return err
		}
	}
	_ = cas.Retry(ctx, op(nil), obs)
	_ = cas.Retry(ctx, op(cas.ErrConflict), obs, cas.WithAttempts(1))
	_ = cas.Retry(ctx, op(errors.New("boom")), obs)
	func() {
		defer func() { _ = recover() }()
		_ = cas.Retry(ctx, func(context.Context) error { panic("op") }, obs)
	}()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_ = cas.Retry(cancelled, op(nil), obs)
	_ = cas.Retry(ctx, nil, obs)

	pool := testenv.Postgres(t)
	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](b, nil, obs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Create(ctx, "k", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, "k", func(v int) (int, error) { return v + 1, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Update(ctx, "", func(v int) (int, error) { return v, nil }); !errors.Is(err, cas.ErrInvalid) {
		t.Fatalf("Update of an empty key: %v", err)
	}
	calls.Want(t, []testenv.WantCall{
		testenv.Ends(cas.CallRetry, "", cas.EventCommitted, false),
		testenv.Ends(cas.CallRetry, "", cas.EventGaveUp, true),
		testenv.Ends(cas.CallRetry, "", cas.EventFailed, true),
		testenv.Ends(cas.CallRetry, "", cas.EventFailed, true),
		testenv.Ends(cas.CallRetry, "", cas.EventFailed, true),
		testenv.Ends(cas.CallRetry, "", cas.EventFailed, true),
		testenv.Ends(cas.CallUpdate, "k", cas.EventUpdated, false),
		testenv.Ends(cas.CallUpdate, "", cas.EventFailed, true),
	})
	if inOp != 3 {
		t.Errorf("op ran %d times with its call's ctx, want 3", inOp)
	}
	// Retry's conflict came in its call.
	if in, _ := calls.Events(); in < 1 {
		t.Errorf("%d events in calls, want the conflict at least", in)
	}
}
