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
	// EventUpdated: an Update returned its result. Fields: Key, Duration
	// (the call's).
	EventUpdated = "cas.updated"
	// EventFailed: an Update, or a Retry that did not give up, returned an
	// error (bad arguments, fn's or op's own error, ErrAmbiguousCommit,
	// ctx's, an Update's give-up). Fields: Key, Duration (the call's), Err.
	EventFailed = "cas.failed"
)

// The calls Store and Retry report to the observer of WithObserver
// (observe.Call.Name): each begins with the observer's Start and ends
// with its End, whose event is the call's outcome. Key is the record's
// key, empty for Retry.
const (
	// CallUpdate is a Store's Update; it ends with EventUpdated or
	// EventFailed. Its writes' events (EventConflict, EventRetry,
	// EventCommitted, EventGaveUp: one per coalesced write) are a Store's
	// own, with the context of the write.
	CallUpdate = "cas.update"
	// CallRetry is a Retry (pgcas.Retry, a Retry with a dynamocas
	// transaction); it ends with EventCommitted, EventGaveUp or
	// EventFailed. Its EventConflict and EventRetry come between, with
	// the context Start returned, which op gets.
	CallRetry = "cas.retry_op"
)
