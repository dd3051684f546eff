package inbox

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"
)

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
	// Partitions holds, for each partition this Inbox has handled a
	// message of (applied, skipped as a duplicate or parked, by Process
	// or Run; not ReplayParked), its position and lag, sorted by topic
	// and partition. A partition stays listed after its messages stop
	// coming (a rebalance gave it to another member): its Lag is then as
	// this Inbox last saw it.
	Partitions []PartitionStats
}

// PartitionStats is where an Inbox is in one partition, as of the
// messages of it that the Inbox handled: its fields have the meanings of
// partition.PartitionStats' fields of the same names.
type PartitionStats struct {
	Topic     string
	Partition int
	// NextOffset is the offset after the last message handled (applied,
	// skipped as a duplicate, or parked).
	NextOffset int64
	// HighWaterMark is the partition's high-water mark (the offset after
	// its last record), the highest that the fetches of the messages
	// handled reported (kafka.Message's HighWaterMark; 0 when none
	// carried one, as in a Process of messages built by hand). It is not
	// refreshed while no message of the partition is handled.
	HighWaterMark int64
	// Lag is HighWaterMark - NextOffset, not below 0: the records Kafka
	// held, as last seen, that the Inbox has not yet handled. A kafka-go
	// Reader with a GroupID, which Run reads through, does not know its
	// lag (Reader.Lag is -1): this one does, from the messages themselves.
	// -1 when HighWaterMark is unknown (0).
	Lag int64
}

// Stats returns a snapshot of the counters and partitions. Each counter
// is read atomically, one after the other. It does no I/O and is safe for
// concurrent use, also with Run.
func (in *Inbox) Stats() Stats {
	return Stats{
		Processed: in.counts.processed.Load(), Duplicates: in.counts.duplicates.Load(),
		Parked: in.counts.parked.Load(), NoID: in.counts.noID.Load(),
		Partitions: in.counts.partitions(),
	}
}

// counters are an Inbox's Stats.
type counters struct {
	processed, duplicates, parked, noID atomic.Int64

	mu  sync.Mutex
	pos map[topicPartition]position // guarded by mu
}

type position struct{ next, hwm int64 }

// handled records that msgs were handled: each partition's position
// moves past its highest offset there, and its high-water mark up to the
// highest seen.
func (c *counters) handled(msgs ...kafka.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pos == nil {
		c.pos = map[topicPartition]position{}
	}
	for _, m := range msgs {
		k := topicPartition{m.Topic, m.Partition}
		p := c.pos[k] // a redelivery's older offsets do not move it back
		c.pos[k] = position{next: max(p.next, m.Offset+1), hwm: max(p.hwm, m.HighWaterMark)}
	}
}

// partitions returns the positions as PartitionStats, sorted.
func (c *counters) partitions() []PartitionStats {
	c.mu.Lock()
	out := make([]PartitionStats, 0, len(c.pos))
	for k, p := range c.pos {
		lag := int64(-1)
		if p.hwm > 0 {
			lag = max(p.hwm-p.next, 0)
		}
		out = append(out, PartitionStats{Topic: k.topic, Partition: k.partition, NextOffset: p.next, HighWaterMark: p.hwm, Lag: lag})
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}
