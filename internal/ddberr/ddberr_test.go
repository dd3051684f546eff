package ddberr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

type status int

func (s status) HTTPStatusCode() int { return int(s) }
func (s status) Error() string       { return fmt.Sprint("http ", int(s)) }

func TestRefused(t *testing.T) {
	// Port 1 on loopback refuses connections: a real dial error.
	_, dialErr := (&net.Dialer{Timeout: 5 * time.Second}).Dial("tcp", "127.0.0.1:1")
	for _, tc := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"condition failed (400)", fmt.Errorf("op: %w", status(400)), true},
		{"throttled (400)", status(400), true},
		{"server error (500)", status(500), false},
		{"connection refused", fmt.Errorf("send: %w", dialErr), true},
		{"connection lost after sending", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), false},
		{"timed out", context.DeadlineExceeded, false},
		{"read error on a connection", &net.OpError{Op: "read", Err: errors.New("reset")}, false},
	} {
		if got := Refused(tc.err); got != tc.refused {
			t.Errorf("%s (%v): refused = %v, want %v", tc.name, tc.err, got, tc.refused)
		}
	}
}
