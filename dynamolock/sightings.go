package dynamolock

import (
	"container/list"
	"sync"
	"time"
)

// defaultSightings bounds a Client's first-sighting cache.
const defaultSightings = 4096

// sightings remembers, per lock, the record version number last seen and
// when this client first saw it (on its own monotonic clock). A lock whose
// version has stayed the same for a full lease since its first sighting
// belongs to a holder that has stopped heartbeating, and may be taken over.
//
// The cache is bounded (least recently used entries are evicted). Forgetting
// is always safe: the next sighting starts a new wait. It is safe for
// concurrent use.
type sightings struct {
	mu    sync.Mutex
	max   int
	byKey map[string]*list.Element // of *sighting
	lru   *list.List               // front: most recently used
}

type sighting struct {
	key, rvn string
	first    time.Time
}

func newSightings(max int) *sightings {
	return &sightings{max: max, byKey: make(map[string]*list.Element), lru: list.New()}
}

// observe records that rvn was seen on key at now and returns when this
// client first saw that rvn there.
func (s *sightings) observe(key, rvn string, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byKey[key]; ok {
		s.lru.MoveToFront(e)
		sg := e.Value.(*sighting)
		if sg.rvn != rvn {
			sg.rvn, sg.first = rvn, now
		}
		return sg.first
	}
	s.byKey[key] = s.lru.PushFront(&sighting{key: key, rvn: rvn, first: now})
	for s.lru.Len() > s.max {
		old := s.lru.Back()
		s.lru.Remove(old)
		delete(s.byKey, old.Value.(*sighting).key)
	}
	return now
}

// forget drops key's sighting (the lock is free or ours).
func (s *sightings) forget(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.byKey[key]; ok {
		s.lru.Remove(e)
		delete(s.byKey, key)
	}
}

func (s *sightings) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}
