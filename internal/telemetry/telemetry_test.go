package telemetry

import (
	"errors"
	"testing"
	"time"

	"github.com/nolock/nolock/observe"
)

// A lock's events move LocksHeld by one each way, whichever way the hold
// ends, and count its hold once.
func TestMeasuresOfLocks(t *testing.T) {
	lost := errors.New("lost")
	for _, c := range []struct {
		e           observe.Event
		held        int64
		hold, batch bool
	}{
		{observe.Event{Name: "lease.acquired"}, 1, false, false},
		{observe.Event{Name: "dynamolock.released", Duration: time.Second}, -1, true, false},
		{observe.Event{Name: "lease.lost", Err: lost}, -1, false, false},
		{observe.Event{Name: "lease.not_released", Duration: time.Second, Err: lost}, -1, true, false},
		{observe.Event{Name: "dynamolock.not_released", Err: lost}, 0, false, false}, // its lost event ended the hold
		{observe.Event{Name: "conditional.released", Duration: time.Second}, 0, false, false},
		{observe.Event{Name: "cas.committed", N: 3}, 0, false, true},
	} {
		m := MeasuresOf(c.e)
		if m.Held != c.held || m.Hold != c.hold || m.Batch != c.batch {
			t.Errorf("MeasuresOf(%s, %v) = %+v, want Held %d, Hold %v, Batch %v", c.e.Name, c.e.Duration, m, c.held, c.hold, c.batch)
		}
	}
}
