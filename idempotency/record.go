package idempotency

import (
	"bytes"
	"fmt"
	"time"
)

// Record is what the store keeps for a key: the request's fingerprint and
// the outcome of the function that ran for it. Times are the database's clock.
type Record struct {
	Scope, Key string
	// Fingerprint identifies the request that stored the record.
	Fingerprint []byte
	// Body is the result the function returned, in the caller's encoding.
	Body []byte
	// Terminal is true when the function marked its outcome terminal (see
	// Terminal): a failure stored and replayed like a success.
	Terminal bool
	// CreatedAt is when the key was claimed; ExpiresAt is when the record
	// stops counting (it is then treated as absent and may be reaped).
	CreatedAt, ExpiresAt time.Time
}

// Result is the outcome of Do: the record, and whether it was replayed
// (stored by an earlier call) rather than produced by this call's function.
type Result struct {
	Record
	// Replayed is true when the function did not run in this call: the
	// result is the one stored by the call that ran it.
	Replayed bool
}

// MismatchError is returned when a key is reused with a different
// fingerprint; errors.Is(err, ErrMismatch) holds. Stored is the record the
// key already has, so the caller can show what the key was used for.
type MismatchError struct {
	// Fingerprint is the fingerprint this call passed.
	Fingerprint []byte
	// Stored is the key's existing record.
	Stored Record
}

// Error says which key was reused, with both fingerprints.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("idempotency: key %q reused with a different request (stored fingerprint %x, this one %x)",
		e.Stored.Key, e.Stored.Fingerprint, e.Fingerprint)
}

// Unwrap returns ErrMismatch.
func (e *MismatchError) Unwrap() error { return ErrMismatch }

// replayOf answers a request with fingerprint fp from a live record: a
// replay, or a *MismatchError if the fingerprints differ.
func replayOf(rec Record, fp []byte) (Result, error) {
	if !bytes.Equal(rec.Fingerprint, fp) {
		return Result{}, &MismatchError{Fingerprint: fp, Stored: rec}
	}
	return Result{Record: rec, Replayed: true}, nil
}

// found is a key's record as readSQL reads it: whether it has expired by
// the database's clock, and whether that server has a synchronous standby.
type found struct {
	Record
	exists, expired, standby bool
	// now is the claim's transaction start (see claimSQL); zero outside
	// a claim.
	now time.Time
}

// scan reads readSQL's columns.
func (f *found) scan(row interface{ Scan(...any) error }) error {
	return row.Scan(&f.Fingerprint, &f.Terminal, &f.Body, &f.CreatedAt, &f.ExpiresAt, &f.expired, &f.standby)
}
