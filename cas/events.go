package cas

// The events a Store and Retry report to the observer of WithObserver, as
// observe.Event values. Key is the record's key, empty for Retry.
const (
	// EventConflict: an attempt lost to another writer, or met a
	// serialization failure or deadlock. Fields: Key, Attempt (the attempt
	// that lost, from 1), Err.
	EventConflict = "cas.conflict"
	// EventRetry: a retry is about to wait. Fields: Key, Attempt (the
	// attempt that just failed), Duration (the wait), Err.
	EventRetry = "cas.retry"
	// EventCommitted: a write applied. Fields: Key, N (the Updates it
	// applied: more than 1 when combined; 1 for Retry).
	EventCommitted = "cas.committed"
	// EventGaveUp: the attempts ran out. Fields: Key, Attempt (how many
	// were made), Err (the last attempt's).
	EventGaveUp = "cas.gave_up"
)
