package idempotency

import "context"

// ExecStatementOnly runs Exec's statement without the read before it, for
// BenchmarkDebit to show what that read costs. Not a usable Exec: a key
// already used fails with a unique violation.
func (s *Store) ExecStatementOnly(ctx context.Context, scope, key string, sql string, args ...any) (Record, error) {
	return s.execStatement(ctx, scope, key, []byte{}, sql, args, "5000")
}
