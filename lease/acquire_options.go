package lease

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/internal/option"
)

// AcquireOption configures one Acquire or TryAcquire: WithWait,
// WithMaxHold, WithData.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	key     string
	wait    time.Duration // 0: until ctx ends
	maxHold time.Duration // 0: no limit
	data    []byte
	set     struct{ wait, maxHold bool }
}

// WithWait bounds how long Acquire waits for a held lock, or retries while
// statements fail (it must be positive). When it passes, Acquire returns a
// *HeldError if it last saw the lock held, or an error wrapping the last
// database error if statements were failing. Without it, Acquire waits
// until its context ends. A statement in flight when it passes is waited
// for no longer than the wait's end.
func WithWait(d time.Duration) AcquireOption {
	return func(a *acquireConfig) { a.wait, a.set.wait = d, true }
}

// WithMaxHold bounds the lock's total hold: when d has passed since the
// acquiring statement was sent, the lock stops renewing, Lost is closed
// (a *LostError with Cause MaxHold) and the row is released. A hung holder
// (stuck in a loop while its renewals keep running) cannot keep the lock
// forever. It must be positive (it may be shorter than the lease); the
// default is no limit.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(a *acquireConfig) { a.maxHold, a.set.maxHold = d, true }
}

// WithData stores a payload (at most MaxDataLen bytes) on the lock row for
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
	if err := validKey(key); err != nil {
		return ac, err
	}
	if err := lockcore.CheckAcquire(ac.wait, ac.set.wait, ac.maxHold, ac.set.maxHold); err != nil {
		return ac, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case len(ac.data) > MaxDataLen:
		return ac, invalid("data is %d bytes, more than %d", len(ac.data), MaxDataLen)
	}
	if len(ac.data) == 0 {
		ac.data = nil
	}
	return ac, nil
}

// validKey checks a lock key: PostgreSQL text holds no NUL and only valid
// UTF-8 (in a UTF-8 database), and a B-tree entry must fit in a page.
func validKey(key string) error {
	switch {
	case key == "":
		return invalid("key is empty")
	case len(key) > MaxKeyLen:
		return invalid("key is %d bytes, more than %d", len(key), MaxKeyLen)
	case strings.IndexByte(key, 0) >= 0:
		return invalid("key %q contains a NUL byte", key)
	case !utf8.ValidString(key):
		return invalid("key %q is not valid UTF-8", key)
	}
	return nil
}
