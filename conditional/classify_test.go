package conditional

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		ambiguous bool
	}{
		{"connection lost mid-statement", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"eof", io.EOF, true},
		{"timed out in flight", context.DeadlineExceeded, true},
		{"server refused", &pgconn.PgError{Code: "57P01"}, false},
		{"encode failed before sending", errors.New("failed to encode args[1]: too big"), false},
	} {
		got := errors.Is(classify(tc.err), ErrAmbiguousCommit)
		if got != tc.ambiguous {
			t.Errorf("%s: ambiguous = %v, want %v", tc.name, got, tc.ambiguous)
		}
		if !errors.Is(classify(tc.err), tc.err) {
			t.Errorf("%s: classify lost the cause", tc.name)
		}
	}
	if classify(nil) != nil {
		t.Error("classify(nil) != nil")
	}
}
