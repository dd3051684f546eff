// Package kafkaerr tells the Kafka errors a consumer should wait out from
// those that end it. A consumer group lives through rebalances,
// coordinator moves, leader elections, broker restarts and lost
// connections; each shows up as an error from kafka-go for a while and
// then goes away. Configuration and authorisation errors, and a client
// that was closed, do not.
package kafkaerr

import (
	"context"
	"errors"
	"io"

	"github.com/segmentio/kafka-go"
)

// Retriable reports whether err, returned by a kafka-go call (a Reader's
// FetchMessage or CommitMessages, a ConsumerGroup's Next, a Client
// request), may go away by itself, so the caller should back off and try
// again. A consumer that must stay up retries everything but what is known
// not to pass:
//   - a Kafka error code, unless kafka-go marks it Temporary or it is one
//     of the group protocol's passing states (rebalance in progress,
//     illegal generation, unknown member: the member rejoins; not
//     coordinator, coordinator loading or not available; not leader,
//     leader, broker or replica not available; request timed out, network
//     exception). So authorisation, invalid configuration and unsupported
//     versions end the caller;
//   - a bare io.EOF, which is how a kafka.Reader reports that it was
//     closed (an io.EOF wrapped by a client call is a connection that
//     closed under it, and retriable); io.ErrClosedPipe, a commit on a
//     closed Reader; kafka.ErrGroupClosed;
//   - context.Canceled.
//
// Everything else is retriable: broken connections (net.Error, refused,
// reset, unexpected EOF), a client's own timeouts (context.DeadlineExceeded:
// the caller checks its own context first), and errors this package does
// not know, which the caller logs as it retries.
func Retriable(err error) bool {
	if err == nil || err == io.EOF || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, kafka.ErrGroupClosed) || errors.Is(err, context.Canceled) {
		return false
	}
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return true
	}
	if kerr.Temporary() {
		return true
	}
	switch kerr {
	case kafka.RebalanceInProgress, kafka.IllegalGeneration, kafka.UnknownMemberId, kafka.MemberIDRequired,
		kafka.NotCoordinatorForGroup, kafka.GroupCoordinatorNotAvailable, kafka.GroupLoadInProgress,
		kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.BrokerNotAvailable, kafka.ReplicaNotAvailable,
		kafka.RequestTimedOut, kafka.NetworkException:
		return true
	}
	return false
}
