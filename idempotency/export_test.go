package idempotency

import "context"

// ExecStatementOnly runs Exec's shared statement (WithSharedRoundTrip)
// without the read before it, for
// BenchmarkDebit to show what that read costs. Not a usable Exec: a key
// already used fails with a unique violation.
func (s *Store) ExecStatementOnly(ctx context.Context, scope, key string, sql string, args ...any) (Record, error) {
	rec := Record{Scope: scope, Key: key}
	_, sargs := s.args(ctx, scope, key, []byte{}, args)
	err := s.run(ctx, s.wrap(sql, len(args), true).text, sargs, &rec)
	return rec, err
}

// PinPlan sets how Exec sends its calls, for the next planMemory calls at
// least: "function" (the default: one call of the statement's function),
// "claim" (the key claimed in a transaction, then the statement with
// COMMIT: what runs where the function cannot be made), "shared" (WithSharedRoundTrip: the read and the
// statement in one round trip) or "readfirst" (WithSharedRoundTrip after
// mostly replays: the read, then the statement alone).
func (s *Store) PinPlan(how string) {
	if shared := how == "shared" || how == "readfirst"; shared != s.shared {
		s.shared = shared
		s.statements.Clear() // wrapped for the other way
	}
	s.noFunc = how == "claim"
	switch how {
	case "function", "claim", "shared":
		s.execPlan.lean.Store(-planMemory)
	case "readfirst":
		s.execPlan.lean.Store(planMemory)
	default:
		panic("PinPlan: " + how)
	}
}

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

// FuncName is the name of the function Exec makes for sql, whose
// parameters have the types oids.
func (s *Store) FuncName(sql string, oids []uint32) string {
	return newExecFunc(s.table, sql, oids).name
}
