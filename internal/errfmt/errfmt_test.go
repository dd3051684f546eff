package errfmt

import (
	"errors"
	"testing"
)

var errConflict = errors.New("cas: version conflict")

type heldError struct{}

func (*heldError) Error() string { return "lease: held by b" }

func TestErrorf(t *testing.T) {
	gaveUp := Errorf("gave up after 3 attempts: %w", errConflict)
	for _, c := range []struct {
		err  error
		want string
	}{
		{Errorf("cas: update %q: %w", "k", gaveUp), `cas: update "k": gave up after 3 attempts: version conflict`},
		{Errorf("cas: %w", errConflict), "cas: version conflict"},
		{Errorf("%w: key is empty", errConflict), "cas: version conflict: key is empty"},
		{Errorf("lease: acquire %q: %w", "k", &heldError{}), `lease: acquire "k": held by b`},
		{Errorf("cas: read: %w; last failure: %w", errors.New("context canceled"), errConflict), "cas: read: context canceled; last failure: version conflict"},
		{Errorf("inbox: handler: %w", errConflict), "inbox: handler: cas: version conflict"},
		{Errorf("Key %q: %w", "k", errConflict), `Key "k": cas: version conflict`},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
		if !errors.Is(c.err, errConflict) && c.want != `lease: acquire "k": held by b` {
			t.Errorf("%q: errors.Is(err, errConflict) = false", c.want)
		}
	}
	var he *heldError
	if !errors.As(Errorf("lease: x: %w", &heldError{}), &he) {
		t.Error("errors.As lost the typed error")
	}
}
