package telemetry

import (
	"context"
	"errors"
	"reflect"
	"unicode"

	"github.com/nolock/nolock/internal/errfmt"
)

// ErrorTypeOther is error.type's value for an error ErrorType cannot
// name (OpenTelemetry's fallback).
const ErrorTypeOther = "_OTHER"

// sentinels names nolock's sentinel errors by their text: the Go name of
// the exported variable, qualified by the package that exports it (the
// PostgreSQL package for a value its DynamoDB twin re-exports). Matching
// by text keeps this module from importing the DynamoDB packages, so a
// PostgreSQL-only program compiles no AWS SDK; nolockotel's TestErrorTypeSentinels
// checks every exported Err* of the library against this table.
var sentinels = map[string]string{
	"cas: version conflict":       "cas.ErrConflict",
	"cas: not found":              "cas.ErrNotFound",
	"cas: already exists":         "cas.ErrExists",
	"cas: invalid argument":       "cas.ErrInvalid",
	"cas: value too large":        "cas.ErrTooLarge",
	"cas: commit outcome unknown": "cas.ErrAmbiguousCommit",
	"cas: closed":                 "cas.ErrClosed",

	"conditional: sold out":                         "conditional.ErrSoldOut",
	"conditional: closed":                           "conditional.ErrClosed",
	"conditional: insufficient balance":             "conditional.ErrInsufficient",
	"conditional: unknown key":                      "conditional.ErrNotFound",
	"conditional: invalid argument":                 "conditional.ErrInvalid",
	"conditional: commit outcome unknown":           "conditional.ErrAmbiguousCommit",
	"conditional: held by another holder":           "conditional.ErrHeld",
	"conditional: already confirmed":                "conditional.ErrConfirmed",
	"conditional: not the holder":                   "conditional.ErrNotHolder",
	"conditional: fenced by a newer token":          "conditional.ErrFenced",
	"conditional: conflict with concurrent writers": "dynamoconditional.ErrConflict",

	"dynamolock: not acquired":            "dynamolock.ErrNotAcquired",
	"dynamolock: lock lost":               "dynamolock.ErrLockLost",
	"dynamolock: lock released":           "dynamolock.ErrReleased",
	"dynamolock: fenced by a newer token": "dynamolock.ErrFenced",
	"dynamolock: invalid argument":        "dynamolock.ErrInvalid",
	"dynamolock: client closed":           "dynamolock.ErrClosed",

	"idempotency: key reused with a different request":    "idempotency.ErrMismatch",
	"idempotency: a request with this key is in progress": "idempotency.ErrInProgress",
	"idempotency: commit outcome unknown":                 "idempotency.ErrAmbiguousCommit",
	"idempotency: invalid argument":                       "idempotency.ErrInvalid",
	"idempotency: no record":                              "idempotency.ErrNotFound",

	"inbox: invalid argument":        "inbox.ErrInvalid",
	"inbox: message has no identity": "inbox.ErrNoID",
	"inbox: commit outcome unknown":  "inbox.ErrAmbiguousCommit",
	"inbox: no such parked message":  "inbox.ErrNotParked",

	"lease: not acquired":     "lease.ErrNotAcquired",
	"lease: lock lost":        "lease.ErrLockLost",
	"lease: lock released":    "lease.ErrReleased",
	"lease: invalid argument": "lease.ErrInvalid",
	"lease: client closed":    "lease.ErrClosed",

	"partition: fenced: a newer owner exists":     "partition.ErrFenced",
	"partition: stored offset no longer in Kafka": "partition.ErrOffsetLost",
	"partition: Run called twice":                 "partition.ErrRunTwice",
	"partition: invalid argument":                 "partition.ErrInvalid",
	"partition: no such parked message":           "partition.ErrNotParked",
	"partition: commit outcome unknown":           "partition.ErrAmbiguousCommit",

	"stopped waiting for a commit in flight": "pgoutcome.ErrStoppedWaiting",
	"pgoutcome: invalid argument":            "pgoutcome.ErrInvalid",

	"nolockotel: invalid argument": "nolockotel.ErrInvalid",
}

// ErrorType is nolockotel.ErrorType (see its doc): a sentinel of nolock by
// its qualified Go name, else the type of the first error of an exported
// type, else ErrorTypeOther; "" for nil.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	if name := sentinelName(err, 0); name != "" {
		return name
	}
	if t := namedType(err, 0); t != "" {
		return t
	}
	return ErrorTypeOther
}

// sentinelName returns the name of the first sentinel in err's tree, or
// "" (depth bounds a cyclic tree).
func sentinelName(err error, depth int) string {
	if err == nil || depth > 32 {
		return ""
	}
	switch err {
	case context.Canceled:
		return "context.Canceled"
	case context.DeadlineExceeded:
		return "context.DeadlineExceeded"
	}
	if reflect.TypeOf(err) == errorString {
		return sentinels[err.Error()]
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return sentinelName(u.Unwrap(), depth+1)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if name := sentinelName(e, depth+1); name != "" {
				return name
			}
		}
	}
	return ""
}

var errorString = reflect.TypeOf(errors.New(""))

// plain are the types of errors.New's, fmt.Errorf's (and nolock's
// errfmt.Errorf's) and errors.Join's errors: text and wrappers, not a class.
var plain = map[reflect.Type]bool{
	errorString: true,
	reflect.TypeOf(errfmt.Errorf("%w", errors.New(""))):                   true,
	reflect.TypeOf(errfmt.Errorf("%w%w", errors.New(""), errors.New(""))): true,
	reflect.TypeOf(errfmt.Errorf("a: %w", errors.New("a: b"))):            true,
	reflect.TypeOf(errors.Join(errors.New(""))):                           true,
}

// namedType returns the type of the first error in err's tree, depth
// first, that is neither plain nor an unexported wrapper, or "".
func namedType(err error, depth int) string {
	if err == nil || depth > 32 {
		return ""
	}
	t := reflect.TypeOf(err)
	u1, one := err.(interface{ Unwrap() error })
	uN, many := err.(interface{ Unwrap() []error })
	if !plain[t] && (exported(t) || !one && !many) {
		return t.String()
	}
	switch {
	case one:
		return namedType(u1.Unwrap(), depth+1)
	case many:
		for _, e := range uN.Unwrap() {
			if name := namedType(e, depth+1); name != "" {
				return name
			}
		}
	}
	return ""
}

// exported reports whether t (or what t points to) has an exported name.
func exported(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	name := t.Name()
	return name != "" && unicode.IsUpper([]rune(name)[0])
}
