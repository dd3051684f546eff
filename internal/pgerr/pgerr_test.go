package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestAmbiguousAndConflict(t *testing.T) {
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
		if got := Ambiguous(tc.err); got != tc.ambiguous {
			t.Errorf("%s: ambiguous = %v, want %v", tc.name, got, tc.ambiguous)
		}
	}
	if Ambiguous(nil) {
		t.Error("Ambiguous(nil)")
	}
	// A connection that could not be made (as a pool's Acquire reports
	// while the server is down) sent nothing. Port 1 on loopback refuses.
	_, err := pgconn.Connect(context.Background(), "postgres://u@127.0.0.1:1/db?connect_timeout=5")
	var connErr *pgconn.ConnectError
	if !errors.As(err, &connErr) || Ambiguous(err) || !NotSent(err) || Ambiguous(fmt.Errorf("acquire: %w", err)) {
		t.Errorf("a refused connection (%v): want NotSent and not Ambiguous", err)
	}
	if !Conflict(&pgconn.PgError{Code: "40001"}) || !Conflict(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"})) || Conflict(&pgconn.PgError{Code: "23505"}) {
		t.Error("Conflict must be true for 40001 and 40P01 only")
	}
}
