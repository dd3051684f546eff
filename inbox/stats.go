package inbox

import "sync/atomic"

// Stats is what an Inbox has done since New, through Process, Run and
// ReplayParked; nothing of other Inboxes, even of the same consumer.
type Stats struct {
	// Processed counts messages whose effect committed with their record
	// (replays included).
	Processed int64
	// Duplicates counts messages skipped because their identity was
	// recorded before (or repeated in their batch): a redelivery, a
	// producer's resend, or an id that repeats one of another topic read
	// under the same consumer name (see New). Run logs them at Info, once
	// per batch.
	Duplicates int64
	// Parked counts messages this Inbox parked.
	Parked int64
	// NoID counts messages without identity (ErrNoID) that Run met: each
	// parked, or the one that stopped Run (see Run).
	NoID int64
}

// Stats returns a snapshot of the counters. Each counter is read
// atomically, one after the other. It does no I/O and is safe for
// concurrent use, also with Run.
func (in *Inbox) Stats() Stats {
	return Stats{
		Processed: in.counts.processed.Load(), Duplicates: in.counts.duplicates.Load(),
		Parked: in.counts.parked.Load(), NoID: in.counts.noID.Load(),
	}
}

// counters are an Inbox's Stats.
type counters struct {
	processed, duplicates, parked, noID atomic.Int64
}
