package partition

import (
	"cmp"
	"slices"
	"sync"
)

// PartitionStats is a snapshot of one partition this member owns: what
// its worker has read and applied. Counters are this Consumer's since Run
// began, across its claims of the partition; they are not shared with
// other members.
type PartitionStats struct {
	Topic     string
	Partition int
	// Epoch and Generation are the current claim's.
	Epoch      int64
	Generation int32

	// NextOffset is where the partition goes on: past the last message
	// applied or parked and past the control records and records of
	// aborted transactions skipped after it. Before the claim's first
	// batch it is the stored offset, or the group's Kafka offset for a
	// partition with none stored, or else the first offset fetched (where
	// the start offset (WithStartOffset) led); -1 until then.
	NextOffset int64
	// LastApplied is the offset of the last message applied or parked by
	// this Consumer; -1 before the first.
	LastApplied int64
	// HighWaterMark is the partition's high-water mark (the offset after
	// its last record, committed transaction or not) as the last fetch
	// that returned records reported it; -1 before one did. Fetches carry
	// it, so it costs no request; but it is not refreshed while nothing
	// new arrives, and read committed, records of a transaction still open
	// are below it and not yet readable.
	HighWaterMark int64
	// Lag is HighWaterMark - NextOffset, not below 0: the records Kafka
	// held, as last seen, that the worker has not yet handled. -1 while
	// either is unknown.
	Lag int64

	Messages    int64 // messages applied: committed with the Handler's effects
	Batches     int64 // batches done: applied, or split and applied or parked one by one
	Parked      int64 // messages parked (see WithAttempts)
	Skipped     int64 // control records and records of aborted transactions left out
	FetchErrors int64 // failed reads and classifying fetches, each retried or ending the worker
	// Duplicates counts messages of batches that an earlier attempt had
	// committed although its commit was reported lost: found applied by
	// the fence, not applied again (Messages counts them once). Each such
	// batch is logged at Info.
	Duplicates int64
}

// Stats returns a snapshot of every partition this member owns now (a
// worker holds a granted claim on it), ordered by topic and partition;
// nil when it owns none, before Run and after. Each partition's figures
// are consistent among themselves; different partitions' are taken one
// after the other. It takes one short lock per partition, does no I/O,
// and is safe for concurrent use, also with Run.
func (c *Consumer) Stats() []PartitionStats {
	c.stats.mu.Lock()
	owned := make([]*partStats, 0, len(c.stats.m))
	for _, p := range c.stats.m {
		owned = append(owned, p)
	}
	c.stats.mu.Unlock()
	var out []PartitionStats
	for _, p := range owned {
		if s, ok := p.snapshot(); ok {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b PartitionStats) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// statsTable holds a Consumer's partitions' figures, one entry per
// partition it ever claimed.
type statsTable struct {
	mu sync.Mutex
	m  map[topicPartition]*partStats
}

type topicPartition struct {
	topic     string
	partition int
}

// claimed records a granted claim whose stored next offset is prev (nil:
// none) and returns the partition's entry for the worker to update.
func (t *statsTable) claimed(cl Claim, prev *int64) *partStats {
	k := topicPartition{cl.Topic, cl.Partition}
	t.mu.Lock()
	if t.m == nil {
		t.m = map[topicPartition]*partStats{}
	}
	p := t.m[k]
	if p == nil {
		p = &partStats{s: PartitionStats{Topic: cl.Topic, Partition: cl.Partition, LastApplied: -1, HighWaterMark: -1}}
		t.m[k] = p
	}
	t.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owners++
	p.s.Epoch, p.s.Generation = cl.Epoch, cl.Generation
	switch {
	case prev != nil:
		p.s.NextOffset = *prev
	case cl.Offset >= 0:
		p.s.NextOffset = cl.Offset
	default:
		p.s.NextOffset = -1
	}
	return p
}

// partStats is one partition's figures. Its worker updates it; Stats
// copies it.
type partStats struct {
	mu     sync.Mutex
	owners int // workers holding a claim now
	s      PartitionStats
}

func (p *partStats) snapshot() (PartitionStats, bool) {
	p.mu.Lock()
	s, owned := p.s, p.owners > 0
	p.mu.Unlock()
	s.Lag = -1
	if s.HighWaterMark >= 0 && s.NextOffset >= 0 {
		s.Lag = max(0, s.HighWaterMark-s.NextOffset)
	}
	return s, owned
}

// released records that a worker let its claim go.
func (p *partStats) released() {
	p.mu.Lock()
	p.owners--
	p.mu.Unlock()
}

// fetched records a fetch's outcome: the first offset it delivered and
// the high-water mark it saw (-1: none), the records it skipped and the
// failed fetches along the way.
func (p *partStats) fetched(first, hwm int64, skipped, failures int) {
	p.mu.Lock()
	if hwm >= 0 {
		p.s.HighWaterMark = hwm
	}
	if p.s.NextOffset < 0 && first >= 0 {
		p.s.NextOffset = first // a fresh partition: the start offset resolved
	}
	p.s.Skipped += int64(skipped)
	p.s.FetchErrors += int64(failures)
	p.mu.Unlock()
}

// handled records a batch done: next is where the partition goes on,
// last the offset of its last message (-1: it had none to apply), applied
// and parked how its messages ended.
func (p *partStats) handled(next, last int64, applied, parked int) {
	p.mu.Lock()
	p.s.NextOffset = next
	if last >= 0 {
		p.s.LastApplied = last
		p.s.Batches++
	}
	p.s.Messages += int64(applied)
	p.s.Parked += int64(parked)
	p.mu.Unlock()
}

// duplicated records n messages of cl's partition found applied by an
// earlier attempt.
func (t *statsTable) duplicated(cl Claim, n int) {
	t.mu.Lock()
	p := t.m[topicPartition{cl.Topic, cl.Partition}]
	t.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	p.s.Duplicates += int64(n)
	p.mu.Unlock()
}
