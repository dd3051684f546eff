package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// Each Do and Exec is a call: fn gets the context the observer's Start
// returned, and End gets it once, with the outcome, for a success, a
// failure, a panic of fn, a cancelled ctx and bad input alike.
func TestCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	calls := &testenv.Calls{}
	b := newBed(t, idempotency.WithObserver(calls))
	var inFn []int
	fn := func(err error) idempotency.Func {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			n, ok := testenv.CallOf(ctx)
			if !ok {
				t.Error("fn's ctx is not the one Start returned")
			}
			inFn = append(inFn, n)
			return nil, err
		}
	}
	if _, err := b.store.Do(ctx, "s", "ok", nil, fn(nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.Do(ctx, "s", "fails", nil, fn(errors.New("boom"))); err == nil {
		t.Fatal("fn's error was not returned")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("fn's panic did not reach Do's caller")
			}
		}()
		_, _ = b.store.Do(ctx, "s", "panics", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, ok := testenv.CallOf(ctx); !ok {
				t.Error("fn's ctx is not the one Start returned")
			}
			panic("fn")
		})
	}()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.store.Do(cancelled, "s", "cancelled", nil, fn(nil)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with a cancelled ctx: %v", err)
	}
	if _, err := b.store.Do(ctx, "s", "", nil, fn(nil)); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("Do with an empty key: %v", err)
	}
	if _, err := b.store.Exec(ctx, "s", "exec", nil, debitSQL, "alice", int64(1)); err != nil {
		t.Fatal(err)
	}
	calls.Want(t, []testenv.WantCall{
		testenv.Ends(idempotency.CallDo, "ok", idempotency.EventRan, false),
		testenv.Ends(idempotency.CallDo, "fails", idempotency.EventFailed, true),
		testenv.Ends(idempotency.CallDo, "panics", idempotency.EventFailed, true),
		testenv.Ends(idempotency.CallDo, "cancelled", idempotency.EventFailed, true),
		testenv.Ends(idempotency.CallDo, "", idempotency.EventFailed, true),
		testenv.Ends(idempotency.CallExec, "exec", idempotency.EventRan, false),
	})
	if len(inFn) != 2 || inFn[0] != 1 || inFn[1] != 2 {
		t.Errorf("fn ran in calls %v, want [1 2]", inFn)
	}
}
