// Package pgbouncertest holds the tests that run every PostgreSQL pattern
// behind PgBouncer in transaction pooling, in every pgx query mode. It
// has no code of its own.
package pgbouncertest
