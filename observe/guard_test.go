package observe_test

import (
	"context"
	"testing"

	"github.com/nolock/nolock/observe"
)

// A guarded observer's panics, in any of its methods, are recovered and
// counted in the Dropped field of its next event (End or Event); each
// Guard counts its own, on top of the Dropped the event already carries.
// A panicking Start returns its ctx argument.
func TestGuard(t *testing.T) {
	if observe.Guard(nil) != nil {
		t.Fatal("Guard(nil) is not nil")
	}
	if observe.Guard(observe.Func(nil)) != nil {
		t.Fatal("Guard(Func(nil)) is not nil")
	}
	var got []int64
	o := &boom{got: &got}
	a, b := observe.Guard(o), observe.Guard(o)
	ctx := context.WithValue(context.Background(), key{}, "caller")
	if c := a.Start(ctx, observe.Call{Name: "boom"}); c != ctx {
		t.Errorf("a panicking Start returned %v, want its ctx", c)
	}
	if c := a.Start(ctx, observe.Call{Name: "ok"}); c.Value(key{}) != "started" {
		t.Errorf("Start returned %v, want the observer's context", c)
	}
	a.End(ctx, observe.Event{Name: "boom"})
	a.Event(ctx, observe.Event{Name: "boom"})
	b.Event(ctx, observe.Event{Name: "boom"})
	a.End(ctx, observe.Event{Name: "ok", Dropped: 5}) // 5 dropped by a queue, 3 panics
	a.Event(ctx, observe.Event{Name: "ok"})
	b.End(ctx, observe.Event{Name: "ok"})
	if want := []int64{8, 0, 1}; len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Errorf("Dropped of the events after the panics: %v, want %v", got, want)
	}
}

type key struct{}

// boom panics on whatever is named "boom", and records the Dropped of the
// other events.
type boom struct{ got *[]int64 }

func (o *boom) Start(ctx context.Context, c observe.Call) context.Context {
	if c.Name == "boom" {
		panic("observer")
	}
	return context.WithValue(ctx, key{}, "started")
}
func (o *boom) End(_ context.Context, e observe.Event)   { o.event(e) }
func (o *boom) Event(_ context.Context, e observe.Event) { o.event(e) }
func (o *boom) event(e observe.Event) {
	if e.Name == "boom" {
		panic("observer")
	}
	*o.got = append(*o.got, e.Dropped)
}

// A Func's Start returns its ctx; its End and Event both call it; a nil
// Func does nothing.
func TestFunc(t *testing.T) {
	var got []string
	f := observe.Func(func(_ context.Context, e observe.Event) { got = append(got, e.Name) })
	ctx := context.Background()
	if c := f.Start(ctx, observe.Call{Name: "x.call"}); c != ctx {
		t.Errorf("Func's Start returned %v, want its ctx", c)
	}
	f.End(ctx, observe.Event{Name: "x.end"})
	f.Event(ctx, observe.Event{Name: "x.event"})
	if len(got) != 2 || got[0] != "x.end" || got[1] != "x.event" {
		t.Errorf("Func got %v, want [x.end x.event]", got)
	}
	var none observe.Func
	none.End(ctx, observe.Event{})
	none.Event(ctx, observe.Event{})
	if c := none.Start(ctx, observe.Call{}); c != ctx {
		t.Errorf("a nil Func's Start returned %v", c)
	}
}
