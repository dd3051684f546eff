package dynamolock_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/nolock/nolock/dynamolock"
)

// ledger checks every acquisition of a key, in one process, against the
// others: when Acquire returns, every other lock of the key has ended (its
// Err is set) or is past its local validity (its last confirmed write's
// send time plus the lease), so no two holders hold the key at once by
// their own clocks; and the token is unlike every other and above every
// token returned before that Acquire began, so tokens never go backwards.
// Both checks are exact: a takeover is sent at least a lease after the
// taker first saw the version it replaces, and that version was sent
// after the old holder's last confirmed write. It also checks that a
// Release that says the lock was held until then (nil) is true: no other
// acquisition of the key returned between the lock's and the Release
// call. Safe for concurrent use.
type ledger struct {
	mu           sync.Mutex
	live         map[string][]*dynamolock.Lock // locks not yet seen ended
	top          map[string]int64              // highest token returned, per key
	tokens       map[string]map[int64]bool
	at           map[*dynamolock.Lock]time.Time // when Acquire returned it
	history      map[string][]*dynamolock.Lock  // per key, in the order Acquire returned them
	acquisitions int
	broken       []string // broken invariants, described
}

func newLedger() *ledger {
	return &ledger{live: map[string][]*dynamolock.Lock{}, top: map[string]int64{}, tokens: map[string]map[int64]bool{},
		at: map[*dynamolock.Lock]time.Time{}, history: map[string][]*dynamolock.Lock{}}
}

// floor returns the highest token of key returned so far: call it before
// Acquire and pass the result to acquired.
func (g *ledger) floor(key string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.top[key]
}

// acquired records l, which Acquire (or TryAcquire) just returned for key;
// floor is what floor said before the call.
func (g *ledger) acquired(key string, l *dynamolock.Lock, floor int64) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.acquisitions++
	keep := g.live[key][:0]
	for _, other := range g.live[key] {
		if other.Err() != nil {
			continue // ended for good
		}
		keep = append(keep, other)
		if until := other.ValidUntil(); until.After(now) {
			g.broken = append(g.broken, fmt.Sprintf("%s: token %d acquired while token %d was valid for %v more",
				key, l.Token(), other.Token(), until.Sub(now)))
		}
	}
	g.live[key] = append(keep, l)
	if g.tokens[key] == nil {
		g.tokens[key] = map[int64]bool{}
	}
	switch tok := l.Token(); {
	case g.tokens[key][tok]:
		g.broken = append(g.broken, fmt.Sprintf("%s: token %d handed out twice", key, tok))
	case tok <= floor:
		g.broken = append(g.broken, fmt.Sprintf("%s: token %d after token %d had been returned", key, tok, floor))
	}
	g.tokens[key][l.Token()] = true
	g.top[key] = max(g.top[key], l.Token())
	g.at[l] = now
	g.history[key] = append(g.history[key], l)
}

// acquiredAt returns when Acquire returned l.
func (g *ledger) acquiredAt(l *dynamolock.Lock) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.at[l]
}

// released records what Release, called at calledAt, returned for l.
func (g *ledger) released(key string, l *dynamolock.Lock, calledAt time.Time, err error) {
	if err != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, other := range g.history[key] {
		if at := g.at[other]; other != l && at.After(g.at[l]) && at.Before(calledAt) {
			g.broken = append(g.broken, fmt.Sprintf("%s: Release of token %d said it held the lock until then, but token %d was acquired meanwhile",
				key, l.Token(), other.Token()))
		}
	}
}

// counts returns the acquisitions recorded and the broken invariants.
func (g *ledger) counts() (acquisitions int, broken []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.acquisitions, append([]string(nil), g.broken...)
}
