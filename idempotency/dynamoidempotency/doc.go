// Package dynamoidempotency is package idempotency on DynamoDB: it makes a
// retried request take effect once by writing the request's idempotency
// key and result in the same TransactWriteItems as the request's effect.
//
// Use it when the effect is a set of DynamoDB writes (conditional puts,
// updates, deletes, condition checks) and callers retry. Store.Do reads the
// key's record: a live one is replayed, or refused when the request differs
// (ErrMismatch); otherwise it calls your Func and commits its writes with
// the record in one transaction, so exactly one of concurrent duplicates
// applies. Record, Result and MismatchError have the same fields as
// package idempotency's, and the errors are the same values, so
// errors.Is(err, idempotency.ErrMismatch) holds for either backend; use
// this package's own types with errors.As. A program that imports only
// this package compiles no pgx.
//
// What it does not promise: expiry is judged by the writers' clocks (leave
// a margin for skew), a Func may run more than once (it must only compute
// writes), and a transaction whose reply is lost is ErrAmbiguousCommit: call
// Do again with the same key to learn which. The PostgreSQL twin is package
// idempotency, which also has Exec, Reap and an HTTP middleware.
package dynamoidempotency
