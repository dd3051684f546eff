package conditional_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Each Hold, HoldAll, Confirm and Release reports its outcome, with the
// resource (HoldAll: the sorted resources joined by ","), N and the call's
// Duration.
func TestHoldsObserver(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	events := &testenv.Events{}
	events.HoldsEvents(t, newHolds(t, pool, conditional.WithTable("nolock_holds"), conditional.WithObserver(observe.Func(events.Observe))))
}

// Each fenced Update reports its outcome with the key and the token.
func TestFencedObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	newDocuments(t, pool)
	events := &testenv.Events{}
	f, err := conditional.NewFenced("documents", "id", "fence", conditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, 1, 5, map[string]any{"body": "v5"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, 1, 4, map[string]any{"body": "v4"}); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("stale token: %v, want ErrFenced", err)
	}
	if err := f.Update(ctx, pool, 2, 5, nil); !errors.Is(err, conditional.ErrNotFound) {
		t.Fatalf("no row: %v, want ErrNotFound", err)
	}
	events.WantNames(t, map[string][]string{"1": {conditional.EventWritten, conditional.EventFenced}, "2": {conditional.EventFailed}})
	if got := events.Of("1", conditional.EventFenced); len(got) != 1 || got[0].Token != 4 || !errors.Is(got[0].Err, conditional.ErrFenced) {
		t.Errorf("fenced event: %+v, want Token 4 and ErrFenced", got)
	}
	if got := events.Of("1", conditional.EventWritten); len(got) != 1 || got[0].Token != 5 || got[0].Duration <= 0 {
		t.Errorf("written event: %+v, want Token 5 and a Duration", got)
	}
	if errs := events.Errs("2", conditional.EventFailed); len(errs) != 1 || !errors.Is(errs[0], conditional.ErrNotFound) {
		t.Errorf("failed event's error: %v, want ErrNotFound", errs)
	}
}

// A panicking observer changes no outcome of Holds or Fenced.
func TestPanickingObserverHoldsFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	newDocuments(t, pool)
	var panicky testenv.Panicky
	boom := conditional.WithObserver(observe.Func(panicky.Observe))
	h := newHolds(t, pool, boom)
	f, err := conditional.NewFenced("documents", "id", "fence", boom)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "a", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "a", "bob", time.Minute); !errors.Is(err, conditional.ErrHeld) {
		t.Fatalf("second holder: %v, want ErrHeld", err)
	}
	if err := h.Confirm(ctx, "a", "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, 1, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, pool, 1, 2, nil); !errors.Is(err, conditional.ErrFenced) {
		t.Fatalf("stale token: %v, want ErrFenced", err)
	}
	if got := readDocument(t, pool, 1).Fence; got != 3 {
		t.Errorf("fence %d, want 3", got)
	}
	panicky.Check(t, 2, 2) // 6 events of two values, Holds and Fenced
}

// NewFenced refuses a nil option, naming it.
func TestNewFencedNilOption(t *testing.T) {
	t.Parallel()
	_, err := conditional.NewFenced("documents", "id", "fence", conditional.WithObserver(nil), nil)
	if !errors.Is(err, conditional.ErrInvalid) || err == nil || !strings.Contains(err.Error(), "option 1 is nil") {
		t.Errorf("NewFenced with a nil option: %v, want ErrInvalid naming option 1", err)
	}
}
