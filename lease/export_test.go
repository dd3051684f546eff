package lease

import "time"

// ValidUntil returns the end of the lock's local validity: the send time
// of its last statement known to have applied, plus the lease, on this
// process's clock.
func (l *Lock) ValidUntil() time.Time { return l.h.ValidUntil() }
