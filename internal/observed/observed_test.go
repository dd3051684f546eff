package observed

import (
	"context"
	"testing"

	"github.com/nolock/nolock/observe"
)

// A nil Observer costs no allocation: Start returns ctx, End and Event do
// nothing.
func TestNilObserverAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	c := observe.Call{Name: "x.call", Key: "k"}
	n := testing.AllocsPerRun(1000, func() {
		cctx, sp := Start(nil, ctx, c)
		defer sp.Unwound(observe.Event{Name: "x.failed"})
		Event(nil, cctx, observe.Event{Name: "x.event"})
		sp.End(observe.Event{Name: "x.done"})
	})
	if n != 0 {
		t.Errorf("%v allocations per call with a nil observer, want 0", n)
	}
}

// A Span ends once: End after End, or Unwound after End, does nothing;
// Unwound ends a Span nobody ended, with ErrPanicked; a nil ctx starts
// nothing; a panicking observer is recovered.
func TestSpanEndsOnce(t *testing.T) {
	var got []observe.Event
	o := observe.Func(func(_ context.Context, e observe.Event) {
		got = append(got, e)
		if e.Name == "boom" {
			panic("observer")
		}
	})
	_, sp := Start(o, context.Background(), observe.Call{})
	sp.End(observe.Event{Name: "a"})
	sp.End(observe.Event{Name: "b"})
	sp.Unwound(observe.Event{Name: "c"})
	_, sp = Start(o, context.Background(), observe.Call{})
	sp.Unwound(observe.Event{Name: "d"})
	if ctx, sp := Start(o, nil, observe.Call{}); ctx != nil || sp.On() {
		t.Error("a nil ctx started a call")
	}
	_, sp = Start(o, context.Background(), observe.Call{})
	sp.End(observe.Event{Name: "boom"})
	Event(o, context.Background(), observe.Event{Name: "boom"})
	if len(got) != 4 || got[0].Name != "a" || got[1].Name != "d" || got[1].Err != ErrPanicked {
		t.Errorf("got %+v, want a, then d with ErrPanicked, then the two booms", got)
	}
}
