// Package cas is optimistic concurrency: read a value with its version,
// decide, and write only if the version is still the one read. When another
// writer got there first, nothing is written and the read-decide-write runs
// again on a fresh read, after a backoff with full jitter.
//
// A compare-and-set needs no lock, so a writer paused in the middle (a GC
// pause, a slow network) cannot corrupt anything: its write carries an old
// version and is refused. Use it when the new value needs application logic
// (a document edit, a state machine); when one SQL statement can express the
// change (a decrement, a guarded status flip), package conditional is faster
// and never retries.
//
// Two ways in:
//   - Retry runs a read-decide-write of your own again on a conflict;
//     pgcas.Retry runs each attempt as a PostgreSQL transaction on your own
//     tables (0 rows from pgcas.Exec, or SQLSTATE 40001/40P01, is a
//     conflict).
//   - Store is a ready typed (key, value, version) store over a Backend:
//     pgcas.Backend on PostgreSQL, dynamocas.Backend on DynamoDB. Concurrent
//     Updates of one key in one process are combined: one leader reads
//     once, applies each caller's function in turn, writes once and answers
//     each caller with its own result, so a hot key costs one conditional
//     write per batch instead of a storm of conflicts.
//
// This package imports neither pgx nor the AWS SDK: a program compiles
// only the backend it imports.
//
// What it does not promise: a function may run more than once (once per
// attempt), so it must have no side effects beyond computing the new value;
// and a write whose outcome is unknown (the connection failed after it was
// sent) is reported as ErrAmbiguousCommit, never retried for you.
package cas
