package idempotency

import "testing"

// plan is optimistic until most recent calls found a record, and
// forgets beyond planMemory calls.
func TestPlanFollowsTheMix(t *testing.T) {
	var p plan
	if p.readFirst() {
		t.Fatal("a new plan reads first, want optimistic")
	}
	for i := 0; i < 1000; i++ { // replays only
		p.observe(true)
	}
	if !p.readFirst() {
		t.Fatal("after replays only: optimistic, want read first")
	}
	for i := 0; i < planMemory; i++ {
		p.observe(i%2 == 0) // as many replays as first runs: no change
	}
	if !p.readFirst() {
		t.Fatal("after an even mix: optimistic, want read first still")
	}
	for i := 0; i < planMemory+1; i++ {
		p.observe(false)
	}
	if p.readFirst() {
		t.Fatalf("after %d first runs: reads first (lean %d), want optimistic: the 1000 replays are forgotten", planMemory+1, p.lean.Load())
	}
}
