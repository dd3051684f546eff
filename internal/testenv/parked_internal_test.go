package testenv

import "testing"

// A goroutine counts as parked in fn only while it waits for another
// goroutine: one held in a GC assist inside fn has not reached its wait.
func TestParkedInCountsOnlyBlockedWaits(t *testing.T) {
	const fn = "internal/combine.(*Combiner[...]).Do"
	trace := func(state string, frames ...string) string {
		g := "goroutine 9 [" + state + "]:\n"
		for _, f := range frames {
			g += f + "(...)\n\t/src/x.go:1 +0x1\n"
		}
		return g + "created by main.start in goroutine 6\n\t/src/main.go:1 +0x1"
	}
	do := "github.com/nolock/nolock/internal/combine.(*Combiner[...]).Do"
	for _, c := range []struct {
		g    string
		want bool
	}{
		{trace("select", "runtime.gopark", "runtime.selectgo", do), true},
		{trace("chan receive, 2 minutes", "runtime.gopark", "runtime.chanrecv1", do), true},
		{trace("GC assist wait", "runtime.gopark", "runtime.gcParkAssist", "runtime.mallocgc", "runtime.newobject", do), false},
		{trace("runnable", do), false},
		{trace("select", "runtime.gopark", "runtime.selectgo", "main.other", do), false},
	} {
		if got := parkedIn(c.g, "6", fn); got != c.want {
			t.Errorf("parkedIn(%q) = %v, want %v", c.g, got, c.want)
		}
	}
}
