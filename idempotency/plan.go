package idempotency

import "sync/atomic"

// plan chooses between two ways of sending a call of Do or Exec, from the
// calls the Store has seen: optimistic, as if the key were new, or reading
// the key's record first. Optimistic claims the key in the transaction's
// first round trip: a replay costs that transaction's two round trips
// instead of one read. Reading first costs a replay the read alone, and a
// first run one round trip more. A plan reads
// first once the calls that found a record outnumber those that did not,
// and is optimistic again once the others have made up the difference (the
// count stops at ±planMemory, so a long past weighs no more than
// planMemory calls). The outcomes are the same either way; only the cost
// differs.
type plan struct {
	lean atomic.Int32 // +1 per call that found a record, -1 per call that did not, within ±planMemory
}

const planMemory = 64

func (p *plan) readFirst() bool { return p.lean.Load() > 0 }

func (p *plan) observe(found bool) {
	for {
		old := p.lean.Load()
		v := old - 1
		if found {
			v = old + 1
		}
		if v < -planMemory || v > planMemory || p.lean.CompareAndSwap(old, v) {
			return
		}
	}
}
