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
//   - Retry and Exec wrap your own tables: Retry runs your function in a
//     fresh transaction per attempt and retries conflicts (0 rows from Exec,
//     or SQLSTATE 40001/40P01).
//   - Store is a ready typed (key, value, version) store on PostgreSQL
//     (PostgresBackend) or DynamoDB (package dynamocas, whose Store is this
//     one, for programs that import no pgx). Concurrent Updates of one key in one process are combined:
//     one leader reads once, applies each caller's function in turn, writes
//     once and answers each caller with its own result, so a hot key costs
//     one conditional write per batch instead of a storm of conflicts.
//
// What it does not promise: a function may run more than once (once per
// attempt), so it must have no side effects beyond computing the new value;
// and a write whose outcome is unknown (the connection failed after it was
// sent) is reported as ErrAmbiguousCommit, never retried for you.
package cas
