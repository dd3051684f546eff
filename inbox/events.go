package inbox

// The events an Inbox reports to the observer of WithObserver, as
// observe.Event values. Key is the "topic/partition" of the batch's first
// message (for a parked message, "topic/partition@offset"); fields not
// listed are zero.
const (
	// EventCommitted: a batch's transaction committed with effects.
	// Fields: Key, N (messages applied), Duration (the transaction).
	EventCommitted = "inbox.committed"
	// EventDuplicate: messages recorded before were skipped. Fields: Key,
	// N (how many).
	EventDuplicate = "inbox.duplicate"
	// EventRetry: a batch or a message failed and will be tried again.
	// Fields: Key, N (messages in the attempt), Attempt, Duration (the
	// wait, for a batch), Err.
	EventRetry = "inbox.retry"
	// EventParked: a message's attempts ran out (or it failed Permanent, or
	// had no identity) and it was parked. Fields: Key (its ParkedID's
	// String, "topic/partition@offset": ParseParkedID reads it back, and
	// ListParked shows the whole message), N (1), Attempt, Err (its last
	// attempt's).
	EventParked = "inbox.parked"
	// EventHandled: the handler returned nil for a message (its effect
	// commits with its batch: see EventCommitted). Fields: Key
	// ("topic/partition@offset"), N (1), Duration (the handler's).
	EventHandled = "inbox.handled"
	// EventHandleFailed: the handler returned an error for a message, or
	// panicked. Fields: Key ("topic/partition@offset"), N (1), Duration,
	// Err (the handler's error; Run's *PanicError).
	EventHandleFailed = "inbox.handle_failed"
)

// The call an Inbox reports to the observer of WithObserver
// (observe.Call.Name).
const (
	// CallHandle is the handler's run on one message, in Process, Run
	// (each attempt) and ReplayParked: it begins with the observer's
	// Start, whose context the handler gets, with Key
	// "topic/partition@offset" and Message the message (its headers carry
	// the producer's trace context), and ends with its End, whose event
	// is EventHandled or EventHandleFailed. A duplicate, whose handler
	// does not run, is no call.
	CallHandle = "inbox.handle"
)
