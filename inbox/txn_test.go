package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// Two transactional producers write interleaved transactions on two
// partitions, every third one aborted. Run with a read-committed Reader
// (the documented setting) applies every committed record once, no record
// of an aborted transaction, and hands no control record (commit and abort
// markers) to the handler or the parked table.
func TestRunTransactionalProducers(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	var mu sync.Mutex
	parked, hook := parkCounter()
	in := newInbox(t, pool, inbox.WithIdentity(inbox.ByFunc(func(m kafka.Message) (string, error) { return string(m.Key), nil })),
		hook, inbox.WithMaxBatch(4), inbox.WithBatchWait(20*time.Millisecond))
	brokers, topic := testenv.Topic(t, 2)

	const batches, per = 9, 4
	var txs []testenv.TxBatch
	committed := map[string]bool{}
	for i := range batches {
		abort := i%3 == 1
		prefix := "commit"
		if abort {
			prefix = "abort"
		}
		recs := testenv.TxRecords(prefix, i, []int32{0, 1}, per)
		txs = append(txs, testenv.TxBatch{Producer: i % 2, Abort: abort, Records: recs})
		for _, r := range recs {
			if !abort {
				committed[r.Value] = true
			}
		}
	}
	testenv.ProduceTransactions(t, topic, 2, txs)

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: topic, GroupID: testenv.Name("g"), StartOffset: kafka.FirstOffset,
		IsolationLevel: kafka.ReadCommitted,
		MaxWait:        100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond,
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
	})
	defer r.Close()
	var strange []kafka.Message // handed over but not produced by the test
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if v := string(m.Value); !strings.HasPrefix(v, "commit-") && !strings.HasPrefix(v, "abort-") {
			mu.Lock()
			strange = append(strange, m)
			mu.Unlock()
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2)`, string(m.Key), string(m.Value))
		return err
	}
	last := txs[len(txs)-1].Records
	lastPrefix := last[0].Value[:len("commit-8-")]
	runUntil(t, in, r, h, func() bool {
		return count(t, pool, `SELECT count(*) FROM effects WHERE id LIKE '`+lastPrefix+`%'`) == len(last)
	})

	applied, doubled, aborted := 0, 0, 0
	for id, n := range effects(t, pool) {
		switch {
		case !committed[id]:
			aborted++
			t.Errorf("applied %q, not a committed record", id)
		case n > 1:
			doubled++
			t.Errorf("applied %q %d times", id, n)
		default:
			applied++
		}
	}
	nParked := count(t, pool, `SELECT count(*) FROM nolock_inbox_parked`)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("committed %d: applied %d, doubled %d, aborted applied %d; control records handed over %d; parked %d (events %d)",
		len(committed), applied, doubled, aborted, len(strange), nParked, parked.Load())
	if applied != len(committed) || len(strange) != 0 || nParked != 0 || parked.Load() != 0 {
		t.Fatalf("want every committed record applied once and nothing else; first handed-over control records: %v", strange[:min(3, len(strange))])
	}
}
