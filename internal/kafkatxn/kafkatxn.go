// Package kafkatxn tells which records of a partition a consumer must not
// apply: Kafka's control records (the commit and abort markers that
// transactional producers leave in the log) and, when reading committed
// data, the records of aborted transactions.
//
// kafka-go's Reader (v0.4.51) hands both to its caller whatever its
// IsolationLevel: with ReadCommitted the broker stops at the last stable
// offset, but it still returns the records of aborted transactions (the
// client is expected to drop them, using the aborted transactions listed
// in the fetch response and the producer id of each record batch) and the
// marker batches, and kafka-go's Reader reads neither the list nor the
// batch attributes. A Filter fetches the same offsets again with kafka-go's
// protocol package, which exposes both, and classifies them the way
// Kafka's Java consumer does.
package kafkatxn

import (
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/nolock/nolock/internal/errfmt"
)

// DefaultMaxBytes bounds one classifying fetch.
const DefaultMaxBytes = 1 << 20

// maxWait bounds how long the broker holds a fetch that finds nothing
// (read committed, an offset at or above the last stable offset).
const maxWait = 500 * time.Millisecond

// Filter classifies the records of one partition. It caches the
// classification of the last fetched range, so a consumer reading forward
// fetches each range once more. A Filter is not safe for concurrent use.
type Filter struct {
	rt        kafka.RoundTripper
	addr      net.Addr
	topic     string
	partition int
	committed bool
	maxBytes  int32

	start, end int64 // classified range [start, end)
	skip       map[int64]bool
}

// New returns a Filter for topic's partition, fetching through rt (a
// *kafka.Transport, which routes the fetch to the partition's leader) from
// the cluster at addr. With committed, records of aborted transactions are
// skipped too, and Skip waits until an offset is below the partition's
// last stable offset (its transaction, if any, has ended).
func New(rt kafka.RoundTripper, addr net.Addr, topic string, partition int, committed bool) *Filter {
	return &Filter{rt: rt, addr: addr, topic: topic, partition: partition, committed: committed, maxBytes: DefaultMaxBytes}
}

// Skip reports whether the record at m's offset is a control record or,
// when reading committed data, a record of an aborted transaction: one
// that must not be applied. m must be of the Filter's partition. It
// returns an error only when a fetch failed (a kafka.Error, a lost
// connection) or ctx ended; the caller retries.
func (f *Filter) Skip(ctx context.Context, m kafka.Message) (bool, error) {
	if m.Topic != "" && (m.Topic != f.topic || m.Partition != f.partition) {
		return false, errfmt.Errorf("kafkatxn: message of %s/%d given to the filter of %s/%d", m.Topic, m.Partition, f.topic, f.partition)
	}
	for m.Offset < f.start || m.Offset >= f.end {
		if err := f.load(ctx, m.Offset); err != nil {
			return false, err
		}
	}
	return f.skip[m.Offset], nil
}

// load fetches and classifies the records from offset on. It returns nil
// with the range not covering offset when the broker had nothing there yet
// (read committed: a transaction still open); Skip then asks again.
func (f *Filter) load(ctx context.Context, offset int64) error {
	level := kafka.ReadUncommitted
	if f.committed {
		level = kafka.ReadCommitted
	}
	msg, err := f.rt.RoundTrip(ctx, f.addr, &fetch.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(maxWait.Milliseconds()),
		MinBytes:       1,
		MaxBytes:       f.maxBytes,
		IsolationLevel: int8(level),
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetch.RequestTopic{{
			Topic: f.topic,
			Partitions: []fetch.RequestPartition{{
				Partition:          int32(f.partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  f.maxBytes,
			}},
		}},
	})
	if err != nil {
		return errfmt.Errorf("kafkatxn: fetch %s/%d at %d: %w", f.topic, f.partition, offset, err)
	}
	res, ok := msg.(*fetch.Response)
	if !ok {
		return errfmt.Errorf("kafkatxn: fetch %s/%d: unexpected response %T", f.topic, f.partition, msg)
	}
	if res.ErrorCode != 0 {
		return errfmt.Errorf("kafkatxn: fetch %s/%d at %d: %w", f.topic, f.partition, offset, kafka.Error(res.ErrorCode))
	}
	var p *fetch.ResponsePartition
	for i := range res.Topics {
		for j := range res.Topics[i].Partitions {
			if q := &res.Topics[i].Partitions[j]; res.Topics[i].Topic == f.topic && int(q.Partition) == f.partition {
				p = q
			}
		}
	}
	if p == nil {
		return errfmt.Errorf("kafkatxn: fetch %s/%d: no answer for the partition", f.topic, f.partition)
	}
	if p.ErrorCode != 0 {
		return errfmt.Errorf("kafkatxn: fetch %s/%d at %d: %w", f.topic, f.partition, offset, kafka.Error(p.ErrorCode))
	}
	skip, first, last, err := classify(p.RecordSet.Records, p.AbortedTransactions, f.committed)
	if err != nil {
		return errfmt.Errorf("kafkatxn: fetch %s/%d at %d: %w", f.topic, f.partition, offset, err)
	}
	if last < offset {
		// Nothing at offset yet: the broker waited maxWait. Give the
		// caller's context a chance before the next fetch.
		return ctx.Err()
	}
	f.start, f.end, f.skip = min(first, offset), last+1, skip
	return nil
}

// classify reads the record batches of one fetch response in order and
// returns the offsets to skip and the first and last offset read (last is
// -1 when there were none). A control batch is always skipped; an abort
// marker ends its producer's aborted transaction. With committed, a
// transactional batch is skipped while its producer has an aborted
// transaction that began at or before the batch (Kafka's own consumer
// logic: the response lists each aborted transaction overlapping the
// fetched range by producer id and first offset).
func classify(records protocol.RecordReader, aborted []fetch.ResponseTransaction, committed bool) (skip map[int64]bool, first, last int64, err error) {
	skip, first, last = map[int64]bool{}, -1, -1
	if records == nil {
		return skip, first, last, nil
	}
	pending := append([]fetch.ResponseTransaction(nil), aborted...)
	sort.Slice(pending, func(i, j int) bool { return pending[i].FirstOffset < pending[j].FirstOffset })
	open := map[int64]bool{} // producers inside an aborted transaction

	batches := []protocol.RecordReader{records}
	if s, ok := records.(*protocol.RecordStream); ok {
		batches = s.Records
	}
	seen := func(o int64) {
		if first < 0 || o < first {
			first = o
		}
		last = max(last, o)
	}
	for _, b := range batches {
		switch b := b.(type) {
		case *protocol.ControlBatch:
			for {
				cr, err := b.ReadControlRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return nil, 0, 0, errfmt.Errorf("control record: %w", err)
				}
				seen(cr.Offset)
				skip[cr.Offset] = true
				if cr.Type == 0 { // abort marker
					delete(open, b.ProducerID)
				}
			}
		case *protocol.RecordBatch:
			for committed && len(pending) > 0 && pending[0].FirstOffset <= b.BaseOffset {
				open[pending[0].ProducerID] = true
				pending = pending[1:]
			}
			drop := committed && b.Attributes.Transactional() && open[b.ProducerID]
			if err := each(b, func(o int64) {
				seen(o)
				if drop {
					skip[o] = true
				}
			}); err != nil {
				return nil, 0, 0, err
			}
		default: // a v0/v1 message set: no transactions
			if err := each(b, seen); err != nil {
				return nil, 0, 0, err
			}
		}
	}
	return skip, first, last, nil
}

// each calls fn with the offset of every record r holds.
func each(r protocol.RecordReader, fn func(int64)) error {
	for {
		rec, err := r.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return errfmt.Errorf("record: %w", err)
		}
		fn(rec.Offset)
		if rec.Key != nil {
			rec.Key.Close()
		}
		if rec.Value != nil {
			rec.Value.Close()
		}
	}
}
