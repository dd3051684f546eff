// Package conditional replaces a lock around read-modify-write with one
// conditional statement: the row decides.
//
// A lock service in front of a database row adds a hop and a failure mode,
// and a paused holder can still write after its lease ends. A conditional
// UPDATE checks and writes in one atomic step at the storage, so there is
// no window to pause in: "UPDATE stock SET qty = qty - $n WHERE key = $k AND
// qty >= $n" either takes the units or changes nothing. Under PostgreSQL's
// Read Committed, a statement blocked on the row re-checks its WHERE against
// the newest version, so the guard needs no lock of its own.
//
// Stock takes units of a key, never below zero. A hot row allows one commit
// (one disk flush) at a time, so Stock coalesces concurrent takes of a key
// in this process into one statement per flush, and can spread a key over
// buckets when several processes write it. Accounts does the same for
// balances (debits never below zero), also inside the caller's
// transaction. Holds hands out timed holds on resources (seats, slots;
// one, all or any one of a set) judged by the database's clock, and says
// who holds what: read holds with its Get and Free, not the table, whose
// layout is not API. Fenced makes a write to your own table conditional on
// a fencing token, so a paused ex-holder's late write is refused.
//
// Package dynamoconditional does the same on DynamoDB with condition
// expressions (its Stock, Accounts, Holds and Fenced), one conditional
// write each (its Stock coalesces concurrent takes too), sharing this
// package's errors; its Holds judges a hold's end by the callers' clocks,
// DynamoDB having none a condition can read. This package compiles no AWS
// SDK.
//
// Use this package when the change fits in one statement on one table.
// When it does not (the new value needs application logic), use package cas.
// When a retry must not apply twice, record an idempotency key in the same
// transaction (package idempotency).
package conditional
