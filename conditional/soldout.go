package conditional

import "time"

// The sold-out cache (WithSoldOutCache) maps a key to when this process
// last saw all of it taken. It is an optimisation only: a mark lets Take
// answer ErrSoldOut without a query for soldOutTTL, and a mark forgotten
// early costs at most one query. So the cache never grows without bound:
// it drops expired marks as it adds new ones, and holds at most soldOutMax.
//
// A mark is never set by a take that read the stock before a restock in
// this process (see restocked and markSoldOut), so a Take after Put
// returns is never refused from the cache.

// soldOutMax bounds the marks one Stock's sold-out cache holds.
const soldOutMax = 1 << 16

// soldOutSweepMin is the smallest size of the cache at which adding a
// mark sweeps it.
const soldOutSweepMin = 64

// cachedSoldOut reports whether key carries a live sold-out mark; an
// expired mark is dropped.
func (s *Stock) cachedSoldOut(key string) bool {
	if s.soldOutTTL == 0 {
		return false
	}
	s.soldOutMu.Lock()
	defer s.soldOutMu.Unlock()
	at, ok := s.soldOut[key]
	if ok && s.now().Sub(at) >= s.soldOutTTL {
		delete(s.soldOut, key)
		return false
	}
	return ok
}

// restocked forgets that key was seen sold out (or gathered) in this
// process, and makes every take that read the stock before now unable to
// mark any key sold out: its read may predate this restock.
func (s *Stock) restocked(key string) {
	s.soldOutMu.Lock()
	s.restocks.Add(1)
	delete(s.soldOut, key)
	s.soldOutMu.Unlock()
	s.setGathered(key, false)
}

// restockGen returns the restock generation; a take reads it before sending
// its statement and passes it to markSoldOut.
func (s *Stock) restockGen() uint64 { return s.restocks.Load() }

// markSoldOut records that key was seen empty by a take that read the
// restock generation gen before its statement, unless a restock in this
// process happened since (the empty read may predate it). Adding a key
// to a cache at its sweep size sweeps it first (see sweepSoldOut).
func (s *Stock) markSoldOut(key string, gen uint64) {
	if s.soldOutTTL == 0 {
		return
	}
	s.soldOutMu.Lock()
	defer s.soldOutMu.Unlock()
	if s.restocks.Load() != gen {
		return
	}
	now := s.now()
	if _, ok := s.soldOut[key]; !ok && len(s.soldOut) >= s.soldOutSweepAt {
		s.sweepSoldOut(now)
	}
	s.soldOut[key] = now
}

// sweepSoldOut drops the expired marks and then, while more than
// soldOutMax/2 remain, arbitrary live ones. The next sweep comes once the
// cache has doubled (at least soldOutSweepMin, at most soldOutMax), so a
// sweep costs O(1) per mark added, amortised, and the cache never holds
// more than soldOutMax marks. Called with soldOutMu held.
func (s *Stock) sweepSoldOut(now time.Time) {
	for k, at := range s.soldOut {
		if now.Sub(at) >= s.soldOutTTL {
			delete(s.soldOut, k)
		}
	}
	for k := range s.soldOut {
		if len(s.soldOut) <= soldOutMax/2 {
			break
		}
		delete(s.soldOut, k)
	}
	s.soldOutSweepAt = min(soldOutMax, max(soldOutSweepMin, 2*len(s.soldOut)))
}
