package partition

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgarg"
)

// maxMaxBytes bounds MaxBytes well inside kafka-go's own bound (a fetch
// response's size is an int32).
const maxMaxBytes = 1 << 30

// validateKafka judges the fetch and group balancer settings of c.
func (c config) validateKafka() error {
	switch {
	case c.MinBytes < 1:
		return invalid("WithMinBytes(%d): below 1", c.MinBytes)
	case c.MaxBytes > maxMaxBytes:
		return invalid("WithMaxBytes(%d): above %d", c.MaxBytes, maxMaxBytes)
	case c.MinBytes > c.MaxBytes:
		return invalid("WithMinBytes(%d): above the maximum %d (WithMaxBytes)", c.MinBytes, c.MaxBytes)
	case c.MaxWait <= 0:
		return invalid("WithMaxWait(%v): not positive", c.MaxWait)
	case c.MaxWait >= c.RebalanceTimeout:
		return invalid("WithMaxWait(%v): not below the rebalance timeout %v: a worker waits for its reader's fetch in flight before its member rejoins", c.MaxWait, c.RebalanceTimeout)
	case len(c.GroupBalancers) == 0:
		return invalid("WithGroupBalancers(): empty (leave the option out for the default)")
	}
	names := make(map[string]bool, len(c.GroupBalancers))
	rack := false
	for i, b := range c.GroupBalancers {
		if b == nil {
			return invalid("WithGroupBalancers: balancer %d is nil", i)
		}
		name := b.ProtocolName()
		switch {
		case name == "":
			return invalid("WithGroupBalancers: balancer %d (%T) has an empty protocol name", i, b)
		case names[name]:
			return invalid("WithGroupBalancers: protocol %q offered twice", name)
		}
		names[name] = true
		switch r := b.(type) {
		case kafka.RackAffinityGroupBalancer:
			rack = rack || r.Rack == c.RackID
		case *kafka.RackAffinityGroupBalancer:
			rack = rack || (r != nil && r.Rack == c.RackID)
		}
	}
	if c.RackID != "" && !rack {
		return invalid("WithRackID(%q): no balancer of WithGroupBalancers is a kafka.RackAffinityGroupBalancer with that Rack: add one, or leave WithGroupBalancers out", c.RackID)
	}
	return nil
}

// validate reports the first setting that cannot work, naming the
// argument or option.
func (c config) validate() error {
	switch {
	case len(c.Brokers) == 0:
		return invalid("brokers is empty")
	case c.GroupID == "":
		return invalid("group is empty")
	case strings.IndexByte(c.GroupID, 0) >= 0 || !utf8.ValidString(c.GroupID):
		return invalid("group %q is not UTF-8 without NUL", c.GroupID)
	case len(c.Topics) == 0:
		return invalid("topics is empty")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return invalid("brokers contains an empty address")
		}
	}
	seen := make(map[string]bool, len(c.Topics))
	for _, t := range c.Topics {
		switch {
		case t == "":
			return invalid("topics contains an empty name")
		case seen[t]:
			return invalid("topics names %q twice", t)
		}
		seen[t] = true
	}
	if err := pgarg.Ident("WithTable", c.Table, len(parkedSuffix)); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case c.MaxBatch < 1:
		return invalid("WithMaxBatch(%d): below 1", c.MaxBatch)
	case c.MaxAttempts < 1:
		return invalid("WithAttempts(%d): below 1", c.MaxAttempts)
	case c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return invalid("WithStartOffset(%d): neither kafka.FirstOffset nor kafka.LastOffset", c.StartOffset)
	case c.BatchWait < 0:
		return invalid("WithBatchWait(%v): negative", c.BatchWait)
	case c.KafkaCommitInterval < 0:
		return invalid("WithKafkaCommitInterval(%v): negative", c.KafkaCommitInterval)
	case c.PartitionWatchInterval <= 0:
		return invalid("WithPartitionWatchInterval(%v): not positive", c.PartitionWatchInterval)
	case c.HeartbeatInterval <= 0:
		return invalid("WithHeartbeatInterval(%v): not positive", c.HeartbeatInterval)
	case c.SessionTimeout <= 0:
		return invalid("WithSessionTimeout(%v): not positive", c.SessionTimeout)
	case c.RebalanceTimeout <= 0:
		return invalid("WithRebalanceTimeout(%v): not positive", c.RebalanceTimeout)
	case c.JoinGroupBackoff <= 0:
		return invalid("WithJoinGroupBackoff(%v): not positive", c.JoinGroupBackoff)
	case c.HeartbeatInterval >= c.SessionTimeout:
		return invalid("WithHeartbeatInterval(%v): not below the session timeout %v", c.HeartbeatInterval, c.SessionTimeout)
	case c.BatchTimeout >= c.RebalanceTimeout:
		return invalid("WithBatchTimeout(%v): not below the rebalance timeout %v: a member finishes its batch before it rejoins, and the coordinator drops members that take longer than that", c.BatchTimeout, c.RebalanceTimeout)
	case c.BatchTimeout < time.Millisecond:
		return invalid("WithBatchTimeout(%v): below 1ms, PostgreSQL's idle_in_transaction_session_timeout resolution", c.BatchTimeout)
	case c.rack && c.RackID == "":
		return invalid("WithRackID(\"\"): empty")
	case c.Retry.Base <= 0 || c.Retry.Cap <= 0:
		return invalid("WithBackoff(%v, %v): not positive", c.Retry.Base, c.Retry.Cap)
	}
	if err := c.Retry.Validate(); err != nil {
		return invalid("WithBackoff: %v", err)
	}
	return c.validateKafka()
}

func invalid(format string, args ...any) error {
	return errfmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
