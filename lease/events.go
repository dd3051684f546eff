package lease

// The events a Client reports to the observer of WithObserver, as
// observe.Event values. Key is the lock's key; fields not listed are zero.
const (
	// EventAcquired: an Acquire or TryAcquire took the lock. Fields: Key,
	// Token, Attempt (statements sent), Duration (the call's wait).
	EventAcquired = "lease.acquired"
	// EventNotAcquired: an Acquire or TryAcquire returned without the
	// lock. Fields: Key, Attempt, Duration, Err (*HeldError, a context's
	// error, the last database error, ErrClosed).
	EventNotAcquired = "lease.not_acquired"
	// EventContended: a try found the lock held by someone else. Fields:
	// Key, Token (the holder's), Attempt.
	EventContended = "lease.contended"
	// EventRenewed: a renewal was confirmed. Fields: Key, Token, Duration
	// (its round trip).
	EventRenewed = "lease.renewed"
	// EventRenewFailed: a renewal failed and will be retried. Fields: Key,
	// Token, Duration, Err.
	EventRenewFailed = "lease.renew_failed"
	// EventExpiring: the holder's lease is about to run out (Expiring
	// closed). Fields: Key, Token.
	EventExpiring = "lease.expiring"
	// EventLost: the lock was lost (Lost closed): expired, taken over, or
	// at its maximum hold. Fields: Key, Token, Err (*LostError with its
	// Cause).
	EventLost = "lease.lost"
	// EventReleased: Release (or Close) released the row. Fields: Key,
	// Token, Duration (how long it was held).
	EventReleased = "lease.released"
	// EventNotReleased: a Release (or a Lock's Close) returned an error:
	// the lock had been lost before (its *LostError; Duration 0), or it
	// was held until this release, which could not be written (Duration:
	// how long it was held; this Client holds it no more, and its row
	// ends with its lease). Fields: Key, Token, Duration, Err.
	EventNotReleased = "lease.not_released"
)

// The calls a Client reports to the observer of WithObserver
// (observe.Call.Name): each begins with the observer's Start and ends
// with its End, whose event is the call's outcome. Key is as in the
// events.
const (
	// CallAcquire is an Acquire; it ends with EventAcquired or
	// EventNotAcquired (bad arguments included).
	CallAcquire = "lease.acquire"
	// CallTryAcquire is a TryAcquire, ending as CallAcquire.
	CallTryAcquire = "lease.try_acquire"
	// CallRelease is a Lock's Release or Close; it ends with
	// EventReleased or EventNotReleased. A Client's Close releases its
	// locks without calls: each release it writes is an EventReleased.
	CallRelease = "lease.release"
)
