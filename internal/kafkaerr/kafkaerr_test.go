package kafkaerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/segmentio/kafka-go"
)

func TestRetriable(t *testing.T) {
	t.Parallel()
	_, dialErr := net.Dial("tcp", "127.0.0.1:1") // refused: a real *net.OpError
	if dialErr == nil {
		t.Fatal("dial to port 1 succeeded")
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"rebalance in progress [27]", kafka.RebalanceInProgress, true},
		{"rebalance in progress, wrapped", fmt.Errorf("commit: %w", kafka.RebalanceInProgress), true},
		{"rebalance in progress, joined", errors.Join(errors.New("join group"), kafka.RebalanceInProgress), true},
		{"not coordinator", kafka.NotCoordinatorForGroup, true},
		{"coordinator loading", kafka.GroupLoadInProgress, true},
		{"coordinator not available", kafka.GroupCoordinatorNotAvailable, true},
		{"not leader", kafka.NotLeaderForPartition, true},
		{"leader not available", kafka.LeaderNotAvailable, true},
		{"request timed out", kafka.RequestTimedOut, true},
		{"network exception", kafka.NetworkException, true},
		{"illegal generation", kafka.IllegalGeneration, true},
		{"unknown member", kafka.UnknownMemberId, true},
		{"unknown topic (Temporary)", kafka.UnknownTopicOrPartition, true},
		{"refused dial", dialErr, true},
		{"refused, bare errno", syscall.ECONNREFUSED, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"connection closed under a request (wrapped EOF)", fmt.Errorf("join group: %w", io.EOF), true},
		{"client timeout", fmt.Errorf("fetch: %w", context.DeadlineExceeded), true},
		{"reader closed (bare io.EOF)", io.EOF, false},
		{"commit on a closed reader", io.ErrClosedPipe, false},
		{"group closed", kafka.ErrGroupClosed, false},
		{"cancelled", context.Canceled, false},
		{"topic authorization failed", kafka.TopicAuthorizationFailed, false},
		{"group authorization failed", kafka.GroupAuthorizationFailed, false},
		{"invalid session timeout", kafka.InvalidSessionTimeout, false},
		{"inconsistent group protocol", kafka.InconsistentGroupProtocol, false},
		{"SASL failed", kafka.SASLAuthenticationFailed, false},
		{"unknown error: logged and retried", errors.New("unable to find selected balancer"), true},
		{"an error wrapping a closed reader's EOF", fmt.Errorf("fetch: %w", io.EOF), true},
	} {
		if got := Retriable(tc.err); got != tc.want {
			t.Errorf("%s (%v): Retriable %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
