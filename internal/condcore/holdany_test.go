package condcore

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// memHolds is a store of holds in memory, for HoldAny's algorithm: each
// resource's holder ("" free, "!x" confirmed by x).
type memHolds struct {
	holder     map[string]string
	reads      int
	holds      []string // the resources Hold was called on, in order
	beforeHold func(resource string)
}

func (m *memHolds) anyOf(holder string, intN func(int) int) AnyOf {
	return AnyOf{
		Read: func(_ context.Context, sorted []string) (map[string]Status, error) {
			m.reads++
			out := map[string]Status{}
			for _, r := range sorted {
				h, ok := m.holder[r]
				switch {
				case !ok:
				case len(h) > 0 && h[0] == '!':
					out[r] = Status{Holder: h[1:], Confirmed: true}
				default:
					out[r] = Status{Holder: h}
				}
			}
			return out, nil
		},
		ValidTTL: func() error { return nil },
		Hold: func(_ context.Context, r string) (time.Time, error) {
			m.holds = append(m.holds, r)
			if m.beforeHold != nil {
				m.beforeHold(r)
			}
			switch h := m.holder[r]; {
			case h == "" || h == holder:
				m.holder[r] = holder
				return time.Unix(1, 0), nil
			case h[0] == '!':
				return time.Time{}, ErrConfirmed
			}
			return time.Time{}, ErrHeld
		},
		Refuse: func(r string, reason error) error { return &refusal{r, reason} },
		IntN:   intN,
	}
}

type refusal struct {
	resource string
	err      error
}

func (r *refusal) Error() string { return HoldMessage(r.resource, r.err) }
func (r *refusal) Unwrap() error { return r.err }

func wantRefusal(t *testing.T, err error, resource string, reason error) {
	t.Helper()
	var r *refusal
	if !errors.As(err, &r) || r.resource != resource || !errors.Is(err, reason) {
		t.Fatalf("err = %v, want a refusal of %q wrapping %v", err, resource, reason)
	}
}

// The first pick is spread over the free resources, never over held or
// confirmed ones: 3000 calls on 6 resources of which 4 are free each
// try every free one at least 500 times first (750 expected).
func TestHoldAnySpreadsOverFree(t *testing.T) {
	ctx := context.Background()
	first := map[string]int{}
	for range 3000 {
		m := &memHolds{holder: map[string]string{"a": "", "b": "bob", "c": "", "d": "!dan", "e": "", "f": ""}}
		got, _, err := HoldAny(ctx, []string{"a", "b", "c", "d", "e", "f"}, "alice", m.anyOf("alice", rand.IntN))
		if err != nil || len(m.holds) != 1 || got != m.holds[0] || m.reads != 1 {
			t.Fatalf("HoldAny = %q, %v after holds %v and %d reads; want one read and one hold", got, err, m.holds, m.reads)
		}
		first[got]++
	}
	for _, r := range []string{"a", "c", "e", "f"} {
		if first[r] < 500 {
			t.Errorf("%q picked first %d times of 3000, want about 750: %v", r, first[r], first)
		}
	}
	if first["b"]+first["d"] != 0 {
		t.Errorf("held or confirmed resources picked: %v", first)
	}
}

// A holder that holds one of the set already gets that one again, even
// when others are free: a retried HoldAny never takes a second.
func TestHoldAnyPrefersOwnHold(t *testing.T) {
	m := &memHolds{holder: map[string]string{"a": "", "b": "alice", "c": ""}}
	got, _, err := HoldAny(context.Background(), []string{"a", "b", "c"}, "alice", m.anyOf("alice", rand.IntN))
	if err != nil || got != "b" || len(m.holds) != 1 {
		t.Fatalf("HoldAny = %q, %v after holds %v; want b, one hold", got, err, m.holds)
	}
}

// When others take the picked resources first, HoldAny reads again and
// tries only those still free; when none is left, it names the first held
// one in sorted order, or, all confirmed, the first.
func TestHoldAnyRereadsAfterLoss(t *testing.T) {
	ctx := context.Background()
	m := &memHolds{holder: map[string]string{"a": "", "b": "", "c": "", "d": ""}}
	// Each attempt finds its resource just taken, and one more taken too.
	m.beforeHold = func(r string) {
		m.holder[r] = "rival-" + r
		for _, o := range []string{"a", "b", "c", "d"} {
			if m.holder[o] == "" {
				m.holder[o] = "rival-" + o
				break
			}
		}
	}
	_, _, err := HoldAny(ctx, []string{"d", "c", "b", "a"}, "alice", m.anyOf("alice", func(int) int { return 0 }))
	wantRefusal(t, err, "a", ErrHeld)
	if len(m.holds) != 2 || m.reads != 3 {
		t.Fatalf("holds %v, %d reads; want 2 holds (each loss takes two) and 3 reads", m.holds, m.reads)
	}

	m = &memHolds{holder: map[string]string{"a": "!x", "b": "!y"}}
	_, _, err = HoldAny(ctx, []string{"b", "a"}, "alice", m.anyOf("alice", rand.IntN))
	wantRefusal(t, err, "a", ErrConfirmed)
	m = &memHolds{holder: map[string]string{"a": "!x"}}
	_, _, err = HoldAny(ctx, []string{"a", "zz"}, "alice", m.anyOf("alice", rand.IntN))
	wantRefusal(t, err, "zz", ErrNotFound)
	if len(m.holds) != 0 {
		t.Fatalf("holds %v, want none before an unknown resource is reported", m.holds)
	}
}
