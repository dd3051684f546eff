// Package lease is a lock on PostgreSQL: a lease judged by the database's
// clock alone, with a fencing token from every acquisition and Chubby's
// lock-delay.
//
// A lock is a row of one table (CreateSchema; the name is yours to
// choose). Acquiring is one statement, the seed's lease SQL made whole:
// INSERT … ON CONFLICT (key) DO UPDATE SET token = token + 1, expires_at =
// clock_timestamp() + lease WHERE the row is released or its lease (plus
// the lock-delay) has run out, RETURNING token. The holder renews with an
// UPDATE conditional on its token and on its lease not having run out;
// release marks the row released and keeps it, so the token never
// restarts. Every expiry and takeover is decided inside the statements by
// the database's clock_timestamp(): no client timestamp is stored or
// compared, so client clock skew does not matter.
//
// The holder's own deadline (when Lost and Expiring fire) is measured on
// its monotonic clock from the moment it sent the statement that acquired
// or renewed the lease. The database starts the lease when it runs that
// statement, later, so the holder believes it holds the lock for less
// time than the database grants it; and a process that resumes after a
// pause finds its deadline passed at once.
//
// Use it when you need one worker at a time across machines (a
// leader-only job, a cron across replicas) and PostgreSQL is what you run.
// Every lock is a lease: a holder paused past it wakes up still running.
// If two holders at once would only waste work, that is fine. If it would
// corrupt data, make the store refuse stale holders: pass Token with every
// write and have the store compare it (conditional.Fenced), or, for rows
// in the same database, add FenceSQL to your statement.
//
// When not to use it: if the data sits in one database and the change is
// one statement, let the row decide with a conditional update (package
// conditional) or a versioned compare-and-set (package cas); no lock is
// needed. If running twice must be harmless, record an idempotency key
// with the effect.
//
// Guarantees, given a PostgreSQL that commits durably and clocks whose
// rates (not readings) roughly agree:
//   - At most one client holds a lock at any time by the database's clock;
//     a holder believes it holds it for less than the database does, as
//     long as its process does not stall past its lease (a stalled holder
//     learns of its loss only when it runs again; fencing covers that).
//   - Tokens of one key only grow: the row is never deleted, and renewals
//     and releases leave the token alone. Across a restart of the server
//     they keep growing (the row is durable).
//   - A live holder is never displaced; a lapsed one's lock can be taken
//     once its lease and the acquirer's lock-delay have run out on the
//     database's clock; a released one's at once. A release commits
//     asynchronously: it is visible at once, and one lost to a crash or
//     failover leaves the lock to run out as a lapsed one would.
//   - A statement whose answer was lost never costs the holder its lock:
//     the row is read back (the token, or the acquisition's nonce, says
//     whether it applied).
//   - No statement that commits is cancelled by the caller's context once
//     sent: the context bounds the wait for its answer only.
//
// What it does not promise: fairness (waiters are not queued),
// reentrancy, or safety against clock rate differences larger than the
// lease's slack. Lock-delay only delays the next holder: a lapsed
// holder's request delayed longer than it still lands, unless fenced.
// Across a failover to an asynchronous standby, a renewal or acquisition
// that was not replicated is lost; with a synchronous standby it is not.
// A release can be lost either way (it commits asynchronously): stop
// writing under a lock before releasing it, since until the lost
// release's lease runs out FenceSQL still admits its token.
//
// Cost: an uncontended acquire and release are one statement each; the
// renewals of all the locks a Client holds are one statement per
// heartbeat; a waiter tries with one statement per poll (after its first
// refusal, which one more statement explains).
package lease
