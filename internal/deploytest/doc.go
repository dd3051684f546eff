// Package deploytest holds tests that run nolock's public PostgreSQL write
// APIs the way users deploy them: directly and behind PgBouncer, in every
// pgx query mode, with faults injected on the wire. It has no API: its
// tests check that what a call returns matches the outcomes table of
// docs/deploying.md and what the database holds.
//
// The lost-reply matrix (matrix_test.go) loses each write's reply before
// and after its commit and checks that a write the caller is told failed
// did not commit, that a committed write is never reported as a definite
// failure, and that the retry the docs prescribe ends with the effect
// applied exactly once.
package deploytest
