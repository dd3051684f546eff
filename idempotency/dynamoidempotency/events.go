package dynamoidempotency

// The events a Store reports to the observer of WithObserver (which says
// when), as observe.Event values, with package idempotency's names; fields
// not listed are zero.
const (
	// EventRan: the effect's writes committed with the record. Fields:
	// Key, Duration (the call's).
	EventRan = "idempotency.ran"
	// EventReplayed: the stored result was returned. Fields: Key,
	// Duration.
	EventReplayed = "idempotency.replayed"
	// EventMismatch: the key was used with another request. Fields: Key,
	// Duration, Err (a *MismatchError).
	EventMismatch = "idempotency.mismatch"
	// EventInProgress: concurrent duplicates kept meeting until the wait
	// ran out. Fields: Key, Duration, Err (wrapping ErrInProgress).
	EventInProgress = "idempotency.in_progress"
	// EventFailed: any other error (ambiguous commits included). Fields:
	// Key, Duration, Err.
	EventFailed = "idempotency.failed"
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
)
