// Package dynamoconditional is package conditional on DynamoDB: it replaces
// a lock around read-modify-write with one conditional write, and the item
// decides.
//
// Stock takes units of a key, never below zero, optionally spread over
// buckets (items) for keys hotter than one item's write limit. Accounts
// debits balances never below zero, and hands out DebitItem and CreditItem
// for your own TransactWriteItems. Holds hands out timed holds on resources
// (seats, slots; one, all or any one of a set) and says who holds what,
// judged by the callers' clocks, DynamoDB having none a condition can
// read. Fenced makes a write to an item of your own table
// conditional on a fencing token, so a paused ex-holder's late write is
// refused. Each change is one conditional UpdateItem (or one
// TransactWriteItems where several items must change together); Stock
// also coalesces concurrent takes of a bucket in a process into one
// write (close it when done), and buckets spread a key over items.
//
// Use it when the data lives in DynamoDB and the change fits one condition
// expression. The PostgreSQL twin is package conditional (the same names:
// conditional.Stock, Accounts, Holds, Fenced), whose errors this package
// returns too, so errors.Is(err, conditional.ErrSoldOut) holds for either
// backend; its HoldError has the same fields as conditional's. A program that imports only this package compiles no
// pgx.
//
// What it does not promise: a write whose answer is lost (a timeout, a 5xx,
// a dropped connection) may have applied and is reported as
// ErrAmbiguousCommit, never retried blindly; takes, debits and credits are
// not idempotent, so read the state or pair the write with an idempotency
// record (package dynamoidempotency) before retrying.
package dynamoconditional
