// Package idempotency makes a retried request take effect once: it records
// the request's idempotency key and result in the same transaction as the
// request's effect.
//
// A client that times out cannot tell whether its payment went through, so
// it retries; a queue redelivers; a user double-clicks. A lock around the
// handler does not help (it expires, and the retry comes later anyway), and
// a key kept in a separate store lets the effect and the key disagree after
// a crash. Here the key is claimed by its lock in the transaction that
// makes the effect, and the key's record, with the result, is inserted
// before the same COMMIT: either both commit or neither does. A retry with the
// same key and request replays the stored result without running anything;
// the same key with another request is refused (ErrMismatch, HTTP 422); a
// duplicate arriving while the first is still running waits for it,
// holding no connection, then replays its result, or runs if the first
// rolled back (bounded: ErrInProgress, HTTP 409).
//
// Store is the PostgreSQL ledger (Do, Get, Reap; Exec when the effect is
// one SQL statement, which then carries the record too); Middleware wraps a
// net/http handler for the Idempotency-Key header. Package
// dynamoidempotency does the same on DynamoDB with TransactWriteItems,
// sharing this package's Record, Result and errors; this package compiles
// no AWS SDK.
//
// Use this package when an effect in your database must not apply twice
// (a debit, an order, a booking) and callers retry. When the effect is
// outside the database (a call to a payment provider), a local transaction
// cannot cover it: pass an idempotency key to the provider instead. For
// messages consumed from a queue, package inbox does the same per message.
package idempotency
