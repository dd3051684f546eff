package lockcore

import (
	"strings"
	"testing"
	"time"
)

func TestCheckDefaultsAndRefusals(t *testing.T) {
	s := Defaults()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if s.Heartbeat != 5*time.Second || s.Warn != 5*time.Second || s.Poll != time.Second || s.Owner == "" {
		t.Fatalf("defaults: %+v", s)
	}
	for _, tc := range []struct {
		name string
		set  func(*Settings)
		want string
	}{
		{"zero lease", func(s *Settings) { s.Lease = 0 }, "lease"},
		{"long lease", func(s *Settings) { s.Lease = MaxLease + 1 }, "lease"},
		{"heartbeat above half", func(s *Settings) { s.Heartbeat, s.Set.Heartbeat = 11*time.Second, true }, "heartbeat"},
		{"zero poll", func(s *Settings) { s.Poll, s.Set.Poll = 0, true }, "poll"},
		{"warning too late", func(s *Settings) { s.Warn, s.Set.Warn = 15*time.Second, true }, "expiry warning"},
		{"empty owner", func(s *Settings) { s.Owner, s.Set.Owner = "", true }, "WithOwner"},
		{"NUL owner", func(s *Settings) { s.Owner, s.Set.Owner = "a\x00", true }, "owner"},
		{"nil clock", func(s *Settings) { s.Now = nil }, "clock"},
	} {
		s := Defaults()
		tc.set(&s)
		if err := s.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", tc.name, err, tc.want)
		}
	}
	if err := CheckAcquire(0, true, 0, false); err == nil {
		t.Error("a zero wait was accepted")
	}
	if err := CheckAcquire(0, false, -1, true); err == nil {
		t.Error("a negative max hold was accepted")
	}
	if err := CheckAcquire(0, false, time.Millisecond, true); err != nil {
		t.Errorf("a max hold shorter than the lease: %v", err)
	}
}

func TestEventsOf(t *testing.T) {
	e := EventsOf("lease")
	if e.Acquired != "lease.acquired" || e.RenewFailed != "lease.renew_failed" || e.NotAcquired != "lease.not_acquired" {
		t.Fatalf("%+v", e)
	}
}
