package dynamoconditional

// The events this package's types report to the observer of WithObserver
// (which says which type reports which), as observe.Event values, with
// package conditional's names; fields not listed are zero.
const (
	// EventGranted: a take or debit was granted. Fields: Key, N (the units
	// asked).
	EventGranted = "conditional.granted"
	// EventRefused: the call was refused and changed nothing. For Stock
	// and Accounts, the stock or balance could not cover it; fields: Key,
	// N, Err (ErrSoldOut; ErrInsufficient for a debit). For Holds, the
	// resource was not the caller's: a hold refused (another's hold, or
	// confirmed), or a Confirm or Release by a caller that does not hold
	// it; fields: Key, N, Duration, Err (a *HoldError wrapping ErrHeld or
	// ErrConfirmed; ErrNotHolder).
	EventRefused = "conditional.refused"
	// EventFailed: any other error: ErrAmbiguousCommit, ErrNotFound (no
	// such key, resource or item), ErrConflict (a take across buckets or a
	// Holds write kept meeting other writes), bad input, DynamoDB's.
	// Fields: those of the call's other events, and Err: Key and N for
	// Stock and Accounts; Key, N and Duration for Holds; Key, Token and
	// Duration for Fenced.
	EventFailed = "conditional.failed"
	// EventBatch: one coalesced write decided several takes. Fields: Key
	// ("key#bucket": the bucket's item), N (how many). It is reported
	// from a goroutine of the Stock's own, which Close drains.
	EventBatch = "conditional.batch"
	// EventHeld: a Hold, HoldAll or HoldAny held (or re-held) its
	// resources. Fields: Key (the resource held; for HoldAll its
	// resources, sorted, joined by ","; HoldAny's refused and failed
	// events too carry its resources so), N (the resources held: 1, or
	// HoldAll's count), Duration (the call's, retries of writes that met
	// a transaction included).
	EventHeld = "conditional.held"
	// EventConfirmed: a Confirm made the hold final (or found it confirmed
	// by the same holder). Fields: Key, N, Duration.
	EventConfirmed = "conditional.confirmed"
	// EventReleased: a Release freed the resource. Fields: Key, N,
	// Duration.
	EventReleased = "conditional.released"
	// EventWritten: a Fenced Update applied with its token. Fields: Key
	// (the key attribute's value, then "/" and each other key attribute's
	// value in the order of their names: a string as is, a number as its
	// text, binary in base64), Token, Duration (the call's).
	EventWritten = "conditional.written"
	// EventFenced: the item carries a newer token: nothing written.
	// Fields: Key, Token (the refused one), Duration, Err (ErrFenced).
	EventFenced = "conditional.fenced"
)

// The calls this package's types report to the observer of WithObserver
// (observe.Call.Name, Key as their events'): each begins with the
// observer's Start, before its arguments are checked, and ends with its
// End, whose event is the call's outcome: EventGranted, EventHeld,
// EventConfirmed, EventReleased or EventWritten; EventRefused or
// EventFenced; or EventFailed (bad input included). The calls' names are
// the same for both backends.
const (
	// CallTake is a Stock's Take.
	CallTake = "conditional.take"
	// CallDebit is an Accounts' Debit.
	CallDebit = "conditional.debit"
	// CallHold, CallHoldAll and CallHoldAny are a Holds' Hold, HoldAll and
	// HoldAny. HoldAny's Key is its resources, sorted, joined by ",".
	CallHold    = "conditional.hold"
	CallHoldAll = "conditional.hold_all"
	CallHoldAny = "conditional.hold_any"
	// CallConfirm and CallRelease are a Holds' Confirm and Release.
	CallConfirm = "conditional.confirm"
	CallRelease = "conditional.release"
	// CallUpdate is a Fenced's Update.
	CallUpdate = "conditional.update"
)
