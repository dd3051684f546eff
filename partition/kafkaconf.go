package partition

import (
	"github.com/segmentio/kafka-go"
)

// maxMaxBytes bounds MaxBytes well inside kafka-go's own bound (a fetch
// response's size is an int32).
const maxMaxBytes = 1 << 30

// validateKafka judges the kafka-go settings of c, whose zero fields hold
// their defaults.
func (c Config) validateKafka() error {
	switch {
	case c.MinBytes < 0:
		return invalid("MinBytes %d is negative", c.MinBytes)
	case c.MaxBytes < 0:
		return invalid("MaxBytes %d is negative", c.MaxBytes)
	case c.MaxBytes > maxMaxBytes:
		return invalid("MaxBytes %d is above %d", c.MaxBytes, maxMaxBytes)
	case c.MinBytes > c.MaxBytes:
		return invalid("MinBytes %d is above MaxBytes %d", c.MinBytes, c.MaxBytes)
	case c.MaxWait >= c.RebalanceTimeout:
		return invalid("MaxWait %v is not below RebalanceTimeout %v: a worker waits for its reader's fetch in flight before its member rejoins", c.MaxWait, c.RebalanceTimeout)
	case len(c.GroupBalancers) == 0:
		return invalid("GroupBalancers is empty (nil means the default)")
	}
	names := make(map[string]bool, len(c.GroupBalancers))
	rack := false
	for i, b := range c.GroupBalancers {
		if b == nil {
			return invalid("GroupBalancers[%d] is nil", i)
		}
		name := b.ProtocolName()
		switch {
		case name == "":
			return invalid("GroupBalancers[%d] (%T) has an empty protocol name", i, b)
		case names[name]:
			return invalid("GroupBalancers offers protocol %q twice", name)
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
		return invalid("RackID %q is set but no GroupBalancers entry is a kafka.RackAffinityGroupBalancer with that Rack: add one, or leave GroupBalancers nil", c.RackID)
	}
	return nil
}
