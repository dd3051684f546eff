// Package inbox gives Kafka consumers effectively-once effects in
// PostgreSQL: each message's identity is recorded in the same transaction
// as its effect, so a redelivered or duplicated message finds its record
// and is skipped, and a message whose transaction rolled back runs again.
//
// Use it when a consumer's effects land in PostgreSQL and messages carry
// an identity (a producer-set header such as Debezium's "id", or a field of
// the payload): Process for batches you fetch yourself, Run to consume a
// kafka-go Reader with retries, one goroutine per partition, and parking.
//
// A message whose handler keeps failing (WithAttempts), fails with a
// Permanent error or has no identity is parked: recorded as processed and
// kept in the parked table, and its partition goes on (ten in a row
// without identity stop Run instead: see Run). Duplicates skipped are
// counted (Stats) and logged at Info per batch, never silently: an
// identity is recorded per consumer name, so ids must be unique across
// the topics one consumer name reads (see New). Operators list
// parked messages (ListParked), replay them once a fix is deployed
// (ReplayParked: exactly once, in the transaction that takes them off the
// parked table) or purge them (PurgeParked, PurgeParkedOlderThan).
// Each batch's transaction is bounded by WithBatchTimeout, so a hung
// handler holds its partition, a connection and its row locks no longer
// than that. The options, the parked messages and the judgement of a
// handler's failures are package partition's.
//
// When not to use it: when effects leave the database (an e-mail, an HTTP
// call), which the transaction does not cover: send those with an
// idempotency key of their own. When messages of one key must be applied
// in order by a single writer across rebalances, use package partition,
// whose epoch fence refuses a paused ex-owner.
//
// What it does not promise: order across partitions; that a handler runs
// once (it may run again after a rolled-back attempt; only a committed run
// counts); that records outlive Reap's retention (a message redelivered
// after its record was reaped runs again).
package inbox
