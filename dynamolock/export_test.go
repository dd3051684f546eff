package dynamolock

import "time"

// ValidUntil returns the end of the lock's local validity: the send time
// of its last write known to have applied, plus the lease, on this
// process's clock. The tests compare it with other holders' acquisitions.
func (l *Lock) ValidUntil() time.Time { return l.h.ValidUntil() }

// MaxHeartbeats is the bound on a Client's heartbeat calls in flight.
const MaxHeartbeats = maxHeartbeats
