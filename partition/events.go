package partition

// The events a Consumer reports to the observer of WithObserver, as
// observe.Event values. Key is the worker's "topic/partition" (for a
// parked message, "topic/partition@offset"); Token is the worker's epoch;
// fields not listed are zero.
const (
	// EventClaimed: a worker claimed its partition. Fields: Key, Token.
	EventClaimed = "partition.claimed"
	// EventCommitted: a batch committed with its offsets. Fields: Key,
	// Token, N (messages), Attempt, Duration (from the first attempt to
	// the commit).
	EventCommitted = "partition.committed"
	// EventRetry: a batch failed and will be tried again, reported before
	// the wait. Fields: Key, Token, N, Attempt (the one that failed),
	// Duration (the wait), Err.
	EventRetry = "partition.retry"
	// EventParked: a message's attempts ran out (or it failed Permanent)
	// and it was parked. Fields: Key (its ParkedID's String,
	// "topic/partition@offset": ParseParkedID reads it back, and ListParked
	// shows the whole message), Token, N (1), Attempt, Err (its last
	// attempt's, a *HandlerError for a Handler's failure).
	EventParked = "partition.parked"
	// EventFenced: a newer owner's epoch refused this worker. Fields: Key,
	// Token, Err (ErrFenced).
	EventFenced = "partition.fenced"
	// EventReleased: the worker stopped. Fields: Key, Token, Duration (how
	// long it owned the partition), Err (nil, ErrFenced, or the error that
	// stops Run).
	EventReleased = "partition.released"
)
