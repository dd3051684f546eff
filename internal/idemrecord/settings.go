package idemrecord

import (
	"math"
	"time"
)

// Settings both stores take, with their defaults.
const (
	// DefaultRetention is how long a record counts unless WithRetention
	// says otherwise.
	DefaultRetention = 24 * time.Hour
	// DefaultWait bounds the wait for a concurrent request with the same
	// key unless WithWait says otherwise.
	DefaultWait = 5 * time.Second
	// MaxWait bounds WithWait: PostgreSQL's lock_timeout takes at most
	// 2^31-1 ms (about 24.8 days). The DynamoDB store keeps the same bound.
	MaxWait = math.MaxInt32 * time.Millisecond
	// MaxRetention bounds WithRetention: 100 years of 365 days. Within it
	// a record's expiry (now() plus the retention in microseconds, as
	// PostgreSQL computes it through a double) is exact to the
	// microsecond.
	MaxRetention = 100 * 365 * 24 * time.Hour
)

// ValidTiming checks a retention and a wait: an ErrInvalid naming the one
// that is out of range, or nil. Retention must be within [1 ms,
// MaxRetention]; wait within [0, MaxWait].
func ValidTiming(retention, wait time.Duration) error {
	switch {
	case retention <= 0:
		return Invalid("WithRetention(%v): not positive", retention)
	case retention < time.Millisecond:
		return Invalid("WithRetention(%v): below 1ms", retention)
	case retention > MaxRetention:
		return Invalid("WithRetention(%v): over %v (100 years)", retention, MaxRetention)
	case wait < 0:
		return Invalid("WithWait(%v): negative", wait)
	case wait > MaxWait:
		return Invalid("WithWait(%v): over %v, PostgreSQL's longest lock_timeout", wait, MaxWait)
	}
	return nil
}
