package inbox

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/kafkaerr"
	"github.com/nolock/nolock/internal/kafkatxn"
)

// partitionBuffer is how many fetched messages a partition holds before
// fetching waits for it (or twice the batch size, if larger).
const partitionBuffer = 256

type topicPartition struct {
	topic     string
	partition int
}

// partitions is one Run: a fetch loop that hands messages to one goroutine
// per partition.
type partitions struct {
	in        *Inbox
	r         Reader
	h         Handler
	run, work context.Context // work keeps run's values, not its end
	serial    *sync.Mutex     // one batch at a time, for a DB that is one connection

	queues map[topicPartition]chan kafka.Message
	met    atomic.Int32 // len(queues), read by ParkedHandler's consumer call
	wg     sync.WaitGroup

	stop  context.CancelFunc // ends run
	fatal struct {           // what stops Run from a partition's goroutine
		once sync.Once
		err  error
	}

	// filter, if set, returns a partition's classifier of control
	// records and records of aborted transactions.
	filter func(topic string, partition int) *kafkatxn.Filter
}

// dispatch fetches until run ends or r fails for good, riding out
// retriable errors with backoff, and queues each message on its
// partition's goroutine (started on its first message). It returns nil
// when run ended.
func (p *partitions) dispatch() error {
	failures := 0
	for {
		m, err := p.r.FetchMessage(p.run)
		if p.run.Err() != nil {
			return nil
		}
		if err != nil {
			if !kafkaerr.Retriable(err) {
				return errfmt.Errorf("inbox: fetch: %w", err)
			}
			failures++
			p.in.log.Warn("inbox: fetch failed; retrying", "attempt", failures, "err", err)
			if backoff.Sleep(p.run, p.in.retry.Delay(failures+1)) != nil {
				return nil
			}
			continue
		}
		failures = 0
		k := topicPartition{m.Topic, m.Partition}
		q, ok := p.queues[k]
		if !ok {
			q = make(chan kafka.Message, max(partitionBuffer, 2*p.in.maxBatch))
			p.queues[k] = q
			p.met.Add(1)
			p.wg.Add(1)
			go p.consume(q)
		}
		select {
		case q <- m:
		case <-p.run.Done():
			return nil
		}
	}
}

// consume processes one partition's messages in order, a batch per
// transaction, until run ends; then it lets the attempt in flight end
// (within the batch timeout), retries nothing, and leaves the rest for
// redelivery.
func (p *partitions) consume(q <-chan kafka.Message) {
	defer p.wg.Done()
	var f *kafkatxn.Filter
	noIDs := 0 // messages without identity in a row
	for {
		batch := p.take(q)
		if batch == nil {
			return
		}
		apply := batch
		if p.filter != nil {
			if f == nil {
				f = p.filter(batch[0].Topic, batch[0].Partition)
			}
			var ok bool
			if apply, ok = p.committed(f, batch); !ok {
				return
			}
		}
		if err := p.checkIdentities(apply, &noIDs); err != nil {
			p.fatal.once.Do(func() { p.fatal.err = err })
			p.stop()
			return
		}
		if p.serial != nil && len(apply) > 0 {
			p.serial.Lock()
		}
		var err error
		if len(apply) > 0 {
			err = p.in.handle(p.run, p.work, apply, p.h)
		}
		if err == nil {
			cctx, cancel := context.WithTimeout(p.work, p.in.batchTimeout)
			err = p.r.CommitMessages(cctx, batch...)
			cancel()
			if err != nil && p.run.Err() == nil {
				// The effects are recorded; a lost commit only means a
				// redelivery, which the inbox skips.
				p.in.log.Warn("inbox: offset commit failed", "err", err)
			}
		}
		if p.serial != nil && len(apply) > 0 {
			p.serial.Unlock()
		}
		if p.run.Err() != nil {
			return
		}
	}
}

// committed returns the messages of batch that are neither control records
// nor records of aborted transactions, waiting while a message's
// transaction is still open. Failures to tell are retried with backoff; it
// returns false once run ended, leaving batch for redelivery.
func (p *partitions) committed(f *kafkatxn.Filter, batch []kafka.Message) ([]kafka.Message, bool) {
	apply := batch[:0:0]
	for _, m := range batch {
		for attempt := 1; ; attempt++ {
			skip, err := f.Skip(p.run, m)
			if err == nil {
				if skip {
					p.in.log.Debug("inbox: skipped a control record or a record of an aborted transaction", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
				} else {
					apply = append(apply, m)
				}
				break
			}
			if p.run.Err() != nil {
				return nil, false
			}
			p.in.log.Warn("inbox: classifying a record failed; retrying", "topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "attempt", attempt, "err", err)
			if backoff.Sleep(p.run, p.in.retry.Delay(attempt+1)) != nil {
				return nil, false
			}
		}
	}
	return apply, true
}

// take waits for one message of q, then takes up to maxBatch-1 more that
// are queued, or that arrive within batchWait while Kafka reported more
// (the last message's offset is below its high-water mark). It returns nil
// once run ended.
func (p *partitions) take(q <-chan kafka.Message) []kafka.Message {
	var first kafka.Message
	select {
	case first = <-q:
	case <-p.run.Done():
		return nil
	}
	batch := []kafka.Message{first}
	var wait <-chan time.Time
	for len(batch) < p.in.maxBatch {
		select {
		case m := <-q:
			batch = append(batch, m)
			continue
		default:
		}
		last := batch[len(batch)-1]
		if last.Offset+1 >= last.HighWaterMark || p.in.batchWait == 0 {
			return batch // the known backlog is read
		}
		if wait == nil {
			t := time.NewTimer(p.in.batchWait)
			defer t.Stop()
			wait = t.C
		}
		select {
		case m := <-q:
			batch = append(batch, m)
		case <-wait:
			return batch
		case <-p.run.Done():
			return batch
		}
	}
	return batch
}

// noIDLimit is how many messages of one partition in a row may lack an
// identity before Run stops: a producer that does not set it, or the
// wrong WithIdentity, rather than a few bad messages.
const noIDLimit = 10

// checkIdentities counts apply's messages without identity, in a row
// across the partition's batches (*inRow), and returns an error wrapping
// ErrNoID once noIDLimit came in a row, before any of apply is handled.
// The first of a row is logged at Error; each is parked when handled.
func (p *partitions) checkIdentities(apply []kafka.Message, inRow *int) error {
	if p.in.identity.watermark {
		return nil
	}
	for _, m := range apply {
		_, err := p.in.id(m)
		if err == nil {
			*inRow = 0
			continue
		}
		p.in.counts.noID.Add(1)
		if *inRow++; *inRow >= noIDLimit {
			return errfmt.Errorf("inbox: %d messages in a row without identity, the last at %s/%d@%d: %w; is the producer setting it? Otherwise choose another WithIdentity",
				*inRow, m.Topic, m.Partition, m.Offset, err)
		}
		if *inRow == 1 {
			p.in.log.Error("inbox: a message without identity: it is parked, and Run stops if this many in a row lack one",
				"topic", m.Topic, "partition", m.Partition, "offset", m.Offset, "limit", noIDLimit, "err", err)
		}
	}
	return nil
}
