package observe_test

import (
	"context"
	"testing"

	"github.com/nolock/nolock/observe"
)

// A guarded observer's panics are recovered and counted in the Dropped
// field of its next event; each Guard counts its own, on top of the
// Dropped the event already carries.
func TestGuard(t *testing.T) {
	if observe.Guard(nil) != nil {
		t.Fatal("Guard(nil) is not nil")
	}
	var got []int64
	o := func(_ context.Context, e observe.Event) {
		if e.Name == "boom" {
			panic("observer")
		}
		got = append(got, e.Dropped)
	}
	a, b := observe.Guard(o), observe.Guard(o)
	ctx := context.Background()
	a.Notify(ctx, observe.Event{Name: "boom"})
	a.Notify(ctx, observe.Event{Name: "boom"})
	b.Notify(ctx, observe.Event{Name: "boom"})
	a.Notify(ctx, observe.Event{Name: "ok", Dropped: 5}) // 5 dropped by a queue, 2 panics
	a.Notify(ctx, observe.Event{Name: "ok"})
	b.Notify(ctx, observe.Event{Name: "ok"})
	if want := []int64{7, 0, 1}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("Dropped of the events after the panics: %v, want %v", got, want)
	}
	var unguarded observe.Observer = func(context.Context, observe.Event) { panic("observer") }
	unguarded.Notify(ctx, observe.Event{}) // recovered: does not reach the test
}
