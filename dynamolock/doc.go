// Package dynamolock is a lock on DynamoDB that never compares clocks of
// different machines, and that hands out a fencing token with every
// acquisition.
//
// A lock is an item of your table, written only with conditional writes. The
// holder heartbeats by writing a new random record version number (RVN)
// conditional on its own; a waiter that sees the same RVN for a full lease
// of its own monotonic clock presumes the holder dead and takes the lock
// over with a write conditional on that RVN. No timestamp is stored: clock
// skew between machines cannot shorten a lease. The item layout follows
// the Java DynamoDB Lock Client's attribute names (ownerName,
// recordVersionNumber, leaseDuration in ms, isReleased, data) and adds a
// number, fencingToken, that every acquiring write increments and returns.
//
// Use it when you need one worker at a time across machines (a leader-only
// job, a nightly cron on six replicas) and DynamoDB is at hand. Every lock
// is a lease: a holder paused past it (a GC pause, a stopped VM) wakes up
// still running. If two holders at once would only waste work, that is
// fine. If it would corrupt data, make the store refuse stale holders: pass
// Token with every write and have the store compare it
// (dynamoconditional.Fenced for your DynamoDB items, conditional.Fenced
// for PostgreSQL rows, ConditionCheck or Transact for a transaction
// checked against the lock item).
//
// When not to use it: if the data sits in one database, let the row decide
// with a conditional update (package conditional) or a versioned
// compare-and-set (package cas); no lock is needed. If running twice must be
// harmless, record an idempotency key with the effect.
//
// Guarantees, given a DynamoDB that applies conditional writes atomically
// and clocks whose rates (not readings) roughly agree:
//   - At most one client believes it holds a lock at any time, as long as no
//     holder's process stalls for longer than its lease (a stalled holder
//     learns of its loss only when it runs again; fencing covers that).
//   - Tokens of one key only grow: the item is never deleted while fencing
//     is on (the default), and heartbeats and releases leave the token alone.
//   - A live holder is never displaced; a dead one's lock is taken over
//     between one lease and one lease plus one poll after its last
//     heartbeat.
//   - A write whose answer was lost never costs the holder its lock: the
//     item is read back and the write adopted if it carries our RVN.
//
// What it does not promise: fairness (waiters are not queued), reentrancy,
// or safety against clock rate differences larger than the lease's slack.
//
// Cost: an uncontended acquire and release are one conditional UpdateItem
// each; a heartbeat is one UpdateItem per lock, spread over the period; a waiter reads the item once per poll
// (on servers that return the item with a failed condition, as DynamoDB
// does, a refused acquisition needs no read).
package dynamolock
