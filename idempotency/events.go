package idempotency

// The events a Store reports to the observer of WithObserver (which says
// when), as observe.Event values; fields not listed are zero.
const (
	// EventRan: the effect ran and committed with its record. Fields: Key,
	// Duration (the call's).
	EventRan = "idempotency.ran"
	// EventReplayed: the stored result was returned. Fields: Key,
	// Duration.
	EventReplayed = "idempotency.replayed"
	// EventMismatch: the key was used with another request. Fields: Key,
	// Duration, Err (a *MismatchError).
	EventMismatch = "idempotency.mismatch"
	// EventInProgress: a concurrent duplicate kept the key past the wait.
	// Fields: Key, Duration, Err (wrapping ErrInProgress).
	EventInProgress = "idempotency.in_progress"
	// EventFailed: any other error (ambiguous commits included). Fields:
	// Key, Duration, Err.
	EventFailed = "idempotency.failed"
	// EventExpired: a Do or Exec met an expired record and took the key
	// over; the call's own outcome follows. Fields: Key.
	EventExpired = "idempotency.expired"
	// EventReaped: a Reap deleted rows. Fields: N (how many).
	EventReaped = "idempotency.reaped"
)

// The calls a Store reports to the observer of WithObserver
// (observe.Call.Name, Key the idempotency key): each begins with the
// observer's Start, whose context fn gets, and ends with its End, whose
// event is the call's outcome: EventRan, EventReplayed, EventMismatch,
// EventInProgress or EventFailed (bad arguments included; a panic of fn,
// which goes on to the caller, is an EventFailed too).
const (
	// CallDo is a Do.
	CallDo = "idempotency.do"
	// CallExec is an Exec.
	CallExec = "idempotency.exec"
)
