package nolockotel

import "time"

// SetNow sets the clock a measures calls' durations with.
func SetNow(a *Adapter, now func() time.Time) { a.now = now }
