// Package nolock is a library of coordination patterns that replace
// distributed locks.
//
// Every practical distributed lock is a lease that expires, so a holder
// paused past its lease (a GC pause, a VM migration, a delayed packet) can
// wake up still believing it owns the lock and write anyway. Checking the
// lease just before writing does not help: the pause can fall between the
// check and the write. Only the resource, checking at write time, sees the
// true order. The packages of this module move that check into the store:
//
//   - cas: versioned compare-and-set with retries, when one statement cannot
//     express the change.
//   - conditional: one-statement conditional updates (stock, seat holds,
//     balance debits, fenced writes), when it can.
//   - idempotency: an idempotency-key ledger written in the same
//     transaction as the effect, so a retry is a no-op.
//   - inbox: the transactional inbox for Kafka consumers, so at-least-once
//     delivery has effectively-once effects.
//   - partition: single-writer Kafka partitions with an epoch that fences a
//     paused ex-owner out of the database.
//   - dynamolock: a DynamoDB lock that never compares clocks, with a
//     fencing token for the writes it protects.
//   - lease: the same lock on PostgreSQL, judged by the database's clock,
//     with Chubby's lock-delay.
//   - observe: one event shape that every package reports through its
//     WithObserver option.
//
// conditional and idempotency work on PostgreSQL; each has a DynamoDB twin
// in a subpackage (conditional/dynamoconditional,
// idempotency/dynamoidempotency) with the same errors and result types.
// cas itself is backend-neutral; its backends are cas/pgcas and
// cas/dynamocas. A program compiles only the client it uses: no AWS SDK for
// PostgreSQL, no pgx for DynamoDB.
//
// Which to use: if the data sits in one database, skip the lock and let the
// row decide (conditional, cas). If running twice must be harmless, record a
// key with the effect (idempotency, inbox). If one writer per key is the
// design, fence hand-overs (partition). If you truly need a lock, take one
// whose token the storage checks (dynamolock). A lock without a fence is only
// good for efficiency: avoiding duplicate work, never preventing corruption.
//
// Every package has the same shape. Constructors take what they cannot do
// without as arguments and everything else as functional options: one
// Option type for a package's constructors, and one per call that takes
// options of its own (lease's AcquireOption). Every argument and option is
// judged as given (an explicit value is never read as the default) and one
// that cannot work, or a setter given to a constructor it does not apply
// to, is refused with the package's ErrInvalid, naming it, before any
// I/O. Every call that blocks takes a context. A nil logger or observer is
// silent.
//
// Start with docs/choosing.md in the repository; `nolock demo` runs the
// cases on real services.
package nolock
