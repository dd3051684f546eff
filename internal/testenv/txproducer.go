package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxRecord is one record a transactional producer writes.
type TxRecord struct {
	Partition  int32
	Key, Value string
}

// TxBatch is one producer transaction: its records, then a commit or, with
// Abort, an abort.
type TxBatch struct {
	Producer int // which of ProduceTransactions' producers writes it
	Abort    bool
	Records  []TxRecord
}

// ProduceTransactions writes batches to topic through producers
// transactional producers (Kafka's own protocol, by franz-go's kgo:
// kafka-go has none). Each batch is one transaction of batch.Producer. The
// batches are interleaved: a batch's records are produced, then the
// previous batch (of another producer) ends, so each partition's log holds
// one transaction's records between another's and its marker. Produce
// retries (idempotent, franz-go's default); any failure ends the test.
func ProduceTransactions(t testing.TB, topic string, producers int, batches []TxBatch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Scale(60*time.Second))
	defer cancel()
	clients := make([]*kgo.Client, producers)
	for i := range clients {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(Kafka(t)...),
			kgo.TransactionalID(Name("tx")),
			kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()),
			kgo.RequestRetries(20),
		)
		if err != nil {
			t.Fatalf("testenv: transactional producer: %v", err)
		}
		defer cl.Close()
		clients[i] = cl
	}
	end := func(b TxBatch) {
		commit := kgo.TryCommit
		if b.Abort {
			commit = kgo.TryAbort
		}
		if err := clients[b.Producer].EndTransaction(ctx, commit); err != nil {
			t.Fatalf("testenv: end transaction (abort %v): %v", b.Abort, err)
		}
	}
	var open *TxBatch
	for i := range batches {
		b := &batches[i]
		if b.Producer < 0 || b.Producer >= producers {
			t.Fatalf("testenv: batch %d names producer %d of %d", i, b.Producer, producers)
		}
		if open != nil && open.Producer == b.Producer {
			end(*open)
			open = nil
		}
		cl := clients[b.Producer]
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("testenv: begin transaction: %v", err)
		}
		recs := make([]*kgo.Record, len(b.Records))
		for j, r := range b.Records {
			recs[j] = &kgo.Record{Partition: r.Partition, Key: []byte(r.Key), Value: []byte(r.Value)}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("testenv: transactional produce: %v", err)
		}
		if open != nil {
			end(*open)
		}
		open = b
	}
	if open != nil {
		end(*open)
	}
}

// TxRecords names the records of a transaction: n records on each of
// partitions, values prefix-<batch>-<partition>-<i>, keyed like their value.
func TxRecords(prefix string, batch int, partitions []int32, n int) []TxRecord {
	var out []TxRecord
	for _, p := range partitions {
		for i := range n {
			v := fmt.Sprintf("%s-%d-%d-%d", prefix, batch, p, i)
			out = append(out, TxRecord{Partition: p, Key: v, Value: v})
		}
	}
	return out
}
