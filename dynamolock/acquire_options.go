package dynamolock

import (
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/internal/option"
)

// AcquireOption configures one Acquire or TryAcquire: WithWait,
// WithMaxHold, WithSortKey, WithData.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	key, sortKey string
	wait         time.Duration // 0: until ctx ends
	maxHold      time.Duration // 0: no limit
	data         []byte
	set          struct{ wait, maxHold, sortKey bool } // which of these an option gave
}

// WithWait bounds how long Acquire waits for a held lock, or retries while
// DynamoDB calls fail (it must be positive). When it passes, Acquire
// returns a *HeldError if it last saw the lock held, or an error wrapping
// the last DynamoDB error if calls were failing. Without it, Acquire waits
// until its context ends. A single call that hangs is cut off after at
// most a lease, so it can overrun the wait by up to that. A dead holder's lock can only be
// taken over after one lease of waiting, so a wait shorter than the
// holder's lease only ever gets a lock that is free or released meanwhile.
func WithWait(d time.Duration) AcquireOption {
	return func(a *acquireConfig) { a.wait, a.set.wait = d, true }
}

// WithMaxHold bounds the lock's total hold: when d has passed since the
// acquiring write was sent, the lock stops heartbeating, Lost is closed
// (a *LostError with Cause MaxHold) and the item is released. A hung holder
// (stuck in a loop while its heartbeat goroutine keeps running) cannot keep
// the lock forever. It must be positive (it may be shorter than the
// lease); the default is no limit.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(a *acquireConfig) { a.maxHold, a.set.maxHold = d, true }
}

// WithSortKey sets the lock's sort key value, required when the Client has
// a sort key attribute (WithKeyAttributes), refused otherwise (even empty).
func WithSortKey(value string) AcquireOption {
	return func(a *acquireConfig) { a.sortKey, a.set.sortKey = value, true }
}

// WithData stores a payload (at most MaxDataLen bytes) on the lock item for
// as long as the lock is held, for other clients to read (HeldError.Data).
// Without it, an acquisition removes the previous holder's data.
func WithData(data []byte) AcquireOption {
	return func(a *acquireConfig) { a.data = append([]byte(nil), data...) }
}

// acquireConfig applies opts and checks them with key against the
// Client's settings, before any I/O: an error wraps ErrInvalid and names
// the argument.
func (c *Client) acquireConfig(key string, opts []AcquireOption) (acquireConfig, error) {
	ac := acquireConfig{key: key}
	if err := option.Apply(opts, func(o AcquireOption) { o(&ac) }); err != nil {
		return ac, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := lockcore.CheckAcquire(ac.wait, ac.set.wait, ac.maxHold, ac.set.maxHold); err != nil {
		return ac, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case key == "":
		return ac, invalid("key is empty")
	case len(key) > MaxKeyLen:
		return ac, invalid("key is %d bytes, more than %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return ac, invalid("key %q is not valid UTF-8 (DynamoDB would store U+FFFD for the bad bytes, merging distinct keys)", key)
	case !utf8.ValidString(ac.sortKey):
		return ac, invalid("sort key %q is not valid UTF-8 (DynamoDB would store U+FFFD for the bad bytes, merging distinct keys)", ac.sortKey)
	case c.cfg.skName != "" && ac.sortKey == "":
		return ac, invalid("sort key is empty; the table's sort key %q needs a value (WithSortKey)", c.cfg.skName)
	case c.cfg.skName == "" && ac.set.sortKey:
		return ac, invalid("sort key %q given, but the Client has no sort key attribute (WithKeyAttributes)", ac.sortKey)
	case len(ac.sortKey) > MaxSortKeyLen:
		return ac, invalid("sort key is %d bytes, more than %d", len(ac.sortKey), MaxSortKeyLen)
	case len(ac.data) > MaxDataLen:
		return ac, invalid("data is %d bytes, more than %d", len(ac.data), MaxDataLen)
	}
	if len(ac.data) == 0 {
		ac.data = nil
	}
	return ac, nil
}
