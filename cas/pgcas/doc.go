// Package pgcas is package cas on PostgreSQL: Retry and Exec for
// compare-and-set on your own tables, and Backend, the table a cas.Store
// keeps its (key, value, version) records in.
//
// Retry runs your function in a fresh transaction per attempt and retries
// conflicts: 0 rows from Exec (a conditional UPDATE whose version moved
// on), or SQLSTATE 40001/40P01. Backend makes every Store operation one
// autocommitted conditional statement.
//
// What it does not promise is what cas does not: a function may run more
// than once (once per attempt), and a commit whose outcome is unknown is
// reported as cas.ErrAmbiguousCommit, never retried for you. The DynamoDB
// twin of Backend is package dynamocas.
package pgcas
