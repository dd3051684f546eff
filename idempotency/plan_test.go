package idempotency

import "testing"

// plan shares the round trip until most recent calls found a record, and
// forgets beyond planMemory calls.
func TestPlanFollowsTheMix(t *testing.T) {
	var p plan
	if !p.shared() {
		t.Fatal("a new plan reads first, want shared")
	}
	for i := 0; i < 1000; i++ { // replays only
		p.observe(true)
	}
	if p.shared() {
		t.Fatal("after replays only: shared, want read first")
	}
	for i := 0; i < planMemory; i++ {
		p.observe(i%2 == 0) // as many replays as first runs: no change
	}
	if p.shared() {
		t.Fatal("after an even mix: shared, want read first still")
	}
	for i := 0; i < planMemory+1; i++ {
		p.observe(false)
	}
	if !p.shared() {
		t.Fatalf("after %d first runs: reads first (lean %d), want shared: the 1000 replays are forgotten", planMemory+1, p.lean.Load())
	}
}
