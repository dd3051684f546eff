package idempotency

import "context"

// PinPlan sets how Exec sends its calls, for the next planMemory calls at
// least: "claim" (the key claimed in a transaction, then the statement with
// COMMIT) or "readfirst" (the key's record read first, as Exec does after
// mostly replays).
func (s *Store) PinPlan(how string) {
	switch how {
	case "claim":
		s.execPlan.lean.Store(-planMemory)
	case "readfirst":
		s.execPlan.lean.Store(planMemory)
	default:
		panic("PinPlan: " + how)
	}
}

// MaxDescribed is how many statement texts a Store remembers.
const MaxDescribed = maxDescribed

// RememberAtMost lowers how many statement texts s remembers, so a test
// reaches the bound in a few calls. Call it before s's first Exec.
func (s *Store) RememberAtMost(n int) { s.maxDescribed = n }

// CheckStatement runs Exec's check of sql against n arguments, and says
// how many statement texts the Store remembers.
func (s *Store) CheckStatement(ctx context.Context, sql string, n int) (remembered int, err error) {
	_, err = s.statement(ctx, sql, make([]any, n))
	s.statements.Range(func(any, any) bool { remembered++; return true })
	return remembered, err
}

// PinDoPlan makes Do read the key's record first (readFirst) or claim the
// key at once, for the next planMemory calls at least.
func (s *Store) PinDoPlan(readFirst bool) {
	if readFirst {
		s.doPlan.lean.Store(planMemory)
	} else {
		s.doPlan.lean.Store(-planMemory)
	}
}

// BusyAttempts is how many attempts of the Store's calls found their key
// held by a request in flight, and waited.
func (s *Store) BusyAttempts() int64 { return s.busy.Load() }
