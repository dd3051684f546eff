package conditional

import (
	"strconv"
	"testing"
	"time"
)

// newSoldOutStock returns a Stock with only its sold-out cache set up, on
// a clock the test moves.
func newSoldOutStock(ttl time.Duration, now *time.Time) *Stock {
	return &Stock{soldOut: map[string]time.Time{}, soldOutTTL: ttl, now: func() time.Time { return *now }}
}

// The sold-out cache stays bounded however many keys sell out: with marks
// expiring it holds about twice the live ones, and with every mark live it
// never holds more than soldOutMax. Live marks below that bound keep
// answering, and the newest mark always does.
func TestSoldOutCacheStaysBounded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		marks int
		step  time.Duration // the clock's advance per mark
		limit int           // the most marks the cache may hold
	}{
		// 1000 marks live at a time (1 s TTL, one mark a millisecond).
		{"marks expire", 100_000, time.Millisecond, 2*1000 + soldOutSweepMin},
		// The clock stands still: every mark stays live.
		{"all live", 3 * soldOutMax, 0, soldOutMax},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := time.Unix(0, 0)
			s := newSoldOutStock(time.Second, &now)
			most := 0
			for i := range tc.marks {
				now = now.Add(tc.step)
				key := "sku-" + strconv.Itoa(i)
				s.markSoldOut(key, s.restockGen())
				most = max(most, len(s.soldOut))
				if !s.cachedSoldOut(key) {
					t.Fatalf("mark %d: the key just marked is not cached", i)
				}
			}
			if most > tc.limit {
				t.Fatalf("the cache held %d marks after %d keys sold out, want at most %d", most, tc.marks, tc.limit)
			}
			if tc.step > 0 {
				half := "sku-" + strconv.Itoa(tc.marks-500) // marked 500 ms ago: live
				if !s.cachedSoldOut(half) {
					t.Fatalf("a live mark was dropped while the cache was below its bound")
				}
				if s.cachedSoldOut("sku-0") {
					t.Fatalf("a mark from %v ago still answers", time.Duration(tc.marks)*tc.step)
				}
			}
		})
	}
}

// A restock after a take read the stock keeps that take from marking the
// key, even when its mark would sweep the cache.
func TestSoldOutCacheRestockBeatsMark(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	s := newSoldOutStock(time.Hour, &now)
	for i := range soldOutSweepMin {
		s.markSoldOut("sku-"+strconv.Itoa(i), s.restockGen())
	}
	gen := s.restockGen()
	s.restocked("late")
	s.markSoldOut("late", gen)
	if s.cachedSoldOut("late") {
		t.Fatal("a take that read the stock before a restock marked the key sold out")
	}
}
