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
	// EventFailed: a batch ended without committing: its worker was
	// fenced, its generation ended, or its attempts ran out (a batch of
	// several is then applied one message at a time, each its own call;
	// a single message is parked). Fields: Key, Token, N (messages),
	// Attempt (the attempts made), Duration (from the first attempt), Err
	// (the last attempt's).
	EventFailed = "partition.failed"
)

// The call a Consumer reports to the observer of WithObserver
// (observe.Call.Name).
const (
	// CallHandle is one batch, handled in one transaction with its
	// offsets: it begins with the observer's Start before the first
	// attempt, with Key the worker's "topic/partition" and Message the
	// batch's first message (its headers carry the producer's trace
	// context), and ends with its End, whose event is EventCommitted or
	// EventFailed. The Handler gets the context Start returned (the same
	// for each attempt), and the batch's EventRetry comes between. Run
	// reports every event, Start and End on the worker's goroutine.
	CallHandle = "partition.handle"
)
