package idempotency_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Each Do and Exec call's outcome reaches the observer: a first run, a
// replay, a mismatch, and a failure with its error.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := &testenv.Events{}
	b := newBed(t, idempotency.WithObserver(observe.Func(events.Observe)))
	pay := func(tx pgx.Tx) ([]byte, error) { return nil, debit(ctx, tx, "alice", 1) }
	fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return pay(tx) }
	for _, fp := range []string{"a", "a", "b"} {
		_, _ = b.store.Do(ctx, "alice", "do-1", []byte(fp), fn)
	}
	for _, fp := range []string{"a", "a"} {
		_, _ = b.store.Exec(ctx, "alice", "exec-1", []byte(fp), debitSQL, "alice", int64(1))
	}
	boom := errors.New("boom")
	_, _ = b.store.Do(ctx, "alice", "do-2", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, boom })

	want := map[string][]string{
		"do-1":   {idempotency.EventRan, idempotency.EventReplayed, idempotency.EventMismatch},
		"exec-1": {idempotency.EventRan, idempotency.EventReplayed},
		"do-2":   {idempotency.EventFailed},
	}
	for key, w := range want {
		if got := events.Names(key); !slices.Equal(got, w) {
			t.Errorf("events of %s: %v, want %v", key, got, w)
		}
	}
	if errs := events.Errs("do-2", idempotency.EventFailed); len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Errorf("failed's error: %v, want boom", errs)
	}
}

// A call that meets an expired record takes the key over and says so
// (idempotency.expired) before its run, through Do and Exec alike.
func TestObserverExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := &testenv.Events{}
	b := newBed(t, idempotency.WithObserver(observe.Func(events.Observe)), idempotency.WithRetention(time.Millisecond))
	fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) { return nil, debit(ctx, tx, "alice", 1) }
	for i := range 2 {
		if i == 1 {
			time.Sleep(20 * time.Millisecond) // the records' 1 ms retention passes on the database's clock
		}
		if _, err := b.store.Do(ctx, "alice", "do-x", nil, fn); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Exec(ctx, "alice", "exec-x", nil, debitSQL, "alice", int64(1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"do-x", "exec-x"} {
		if got, want := events.Names(key), []string{idempotency.EventRan, idempotency.EventExpired, idempotency.EventRan}; !slices.Equal(got, want) {
			t.Errorf("events of %s: %v, want %v", key, got, want)
		}
	}
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{idempotency.EventRan, "idempotency.ran"},
		{idempotency.EventReplayed, "idempotency.replayed"},
		{idempotency.EventMismatch, "idempotency.mismatch"},
		{idempotency.EventInProgress, "idempotency.in_progress"},
		{idempotency.EventFailed, "idempotency.failed"},
		{idempotency.EventExpired, "idempotency.expired"},
		{idempotency.EventReaped, "idempotency.reaped"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
