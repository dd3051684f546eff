// Package lockcore is the logic of a held lock that lease (PostgreSQL) and
// dynamolock (DynamoDB) share: the settings both Clients take, the life of
// a held lock (Lost and Expiring, its Context, Err, the maximum hold, the
// expiry warning, an idempotent release), one renewal loop per client that
// renews the locks that are due, and the wait loop of an acquisition. A
// backend supplies only its calls: renew, release, and the package's own
// error for a loss. Nothing here is exported outside the module: each
// package wraps what it returns in its own types.
package lockcore

import (
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/owner"
	"github.com/nolock/nolock/observe"
)

// Limits and defaults of the settings both Clients share.
const (
	DefaultLease = 20 * time.Second
	MaxLease     = 24 * time.Hour
	pollMax      = time.Second // the default poll: this, or a quarter of the lease if shorter
	maxOwnerLen  = 1024
)

// Settings are a lock Client's shared options, as given; Check fills the
// defaults of those not given and validates them together.
type Settings struct {
	Lease, Heartbeat, Poll, Warn time.Duration
	Set                          struct{ Heartbeat, Poll, Warn, Owner bool }
	Owner                        string
	Logger                       *slog.Logger
	Observer                     observe.Observer
	Now                          func() time.Time
}

// Defaults returns the Settings before any option.
func Defaults() Settings { return Settings{Lease: DefaultLease, Now: time.Now} }

// Check fills the defaults of the settings no option gave (heartbeat,
// expiry warning: a quarter of the lease; poll: a second or a quarter of
// the lease; owner: host name and a UUID) and validates them. Its error
// names the setting, without a package prefix: the caller wraps it in its
// ErrInvalid.
func (s *Settings) Check() error {
	switch {
	case s.Lease < time.Millisecond || s.Lease > MaxLease:
		return errfmt.Errorf("lease %v must be between 1ms and %v", s.Lease, MaxLease)
	case s.Now == nil:
		return errfmt.Errorf("clock is nil")
	}
	if !s.Set.Heartbeat {
		s.Heartbeat = s.Lease / 4
	}
	if s.Heartbeat <= 0 || s.Heartbeat > s.Lease/2 {
		return errfmt.Errorf("heartbeat %v must be positive and at most half the lease %v", s.Heartbeat, s.Lease)
	}
	if !s.Set.Poll {
		s.Poll = min(pollMax, s.Lease/4)
	}
	if s.Poll <= 0 || s.Poll > s.Lease {
		return errfmt.Errorf("poll %v must be positive and at most the lease %v", s.Poll, s.Lease)
	}
	if !s.Set.Warn {
		s.Warn = s.Lease / 4
	}
	if s.Warn < 0 || s.Warn >= s.Lease-s.Heartbeat {
		return errfmt.Errorf("expiry warning %v must be at least 0 and less than the lease minus the heartbeat (%v)", s.Warn, s.Lease-s.Heartbeat)
	}
	if s.Set.Owner && s.Owner == "" {
		return errfmt.Errorf("WithOwner(\"\"): give a name, or leave the option out for a generated one")
	}
	if !s.Set.Owner {
		s.Owner = owner.Default()
	}
	if len(s.Owner) > maxOwnerLen || strings.IndexByte(s.Owner, 0) >= 0 || !utf8.ValidString(s.Owner) {
		return errfmt.Errorf("owner name %q must be at most %d bytes of UTF-8 without NUL", s.Owner, maxOwnerLen)
	}
	return nil
}

// CheckAcquire validates the options of one acquisition that both
// Clients share: a wait and a maximum hold, when given, must be positive.
func CheckAcquire(wait time.Duration, waitSet bool, maxHold time.Duration, maxHoldSet bool) error {
	switch {
	case waitSet && wait <= 0:
		return errfmt.Errorf("wait %v must be positive", wait)
	case maxHoldSet && maxHold <= 0:
		return errfmt.Errorf("max hold %v must be positive", maxHold)
	}
	return nil
}
