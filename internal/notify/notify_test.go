package notify

import (
	"context"
	"runtime"
	"testing"

	"github.com/nolock/nolock/observe"
)

// Events reach the observer in order; while it is blocked, Notify does not
// wait: events past the queue's size are dropped and counted in the next
// delivered one; Close delivers what was queued.
func TestQueue(t *testing.T) {
	if New(nil, 1) != nil {
		t.Fatal("New(nil) is not nil")
	}
	var nilQ *Queue
	nilQ.Notify(context.Background(), observe.Event{}) // no panic
	nilQ.Close()

	release := make(chan struct{})
	got := make(chan observe.Event, 16)
	q := New(observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == "block" {
			<-release
		}
		got <- e
	}), 2)
	ctx := context.Background()
	q.Notify(ctx, observe.Event{Name: "block"})
	for len(got) > 0 || q.waiting() > 0 { // the observer holds "block"
		runtime.Gosched()
	}
	// 2 wait; the other 3 are dropped.
	for range 5 {
		q.Notify(ctx, observe.Event{Name: "x"})
	}
	close(release)
	for len(got) < 3 { // block and the two that waited
		runtime.Gosched()
	}
	q.Notify(ctx, observe.Event{Name: "last"})
	q.Close()
	q.Close()
	close(got)
	var names []string
	var dropped int64
	for e := range got {
		names = append(names, e.Name)
		dropped += e.Dropped
	}
	if len(names) != 4 || names[0] != "block" || names[3] != "last" {
		t.Fatalf("delivered %v: want block first and last last", names)
	}
	if dropped != 3 {
		t.Fatalf("%d reported dropped, want 3 (5 sent, 2 queued)", dropped)
	}
}
