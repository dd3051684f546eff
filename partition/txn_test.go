package partition_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// txBatches are interleaved transactions of two producers on partitions
// 0 and 1, every third one aborted, the last committed; it returns them
// and the values of the committed records.
func txBatches() ([]testenv.TxBatch, map[string]bool) {
	const batches, per = 9, 4
	var out []testenv.TxBatch
	committed := map[string]bool{}
	for i := range batches {
		abort := i%3 == 1
		prefix := "commit"
		if abort {
			prefix = "abort"
		}
		recs := testenv.TxRecords(prefix, i, []int32{0, 1}, per)
		out = append(out, testenv.TxBatch{Producer: i % 2, Abort: abort, Records: recs})
		for _, r := range recs {
			if !abort {
				committed[r.Value] = true
			}
		}
	}
	return out, committed
}

// Two transactional producers write interleaved transactions, some
// aborted. Read committed (the default), the Handler sees every committed
// record once, no record of an aborted transaction and no control record
// (commit and abort markers), and nothing is parked.
func TestTransactionalProducersReadCommitted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 2)
	batches, committed := txBatches()
	testenv.ProduceTransactions(t, b.topic, 2, batches)

	var mu sync.Mutex
	seen := map[string]int{}
	var strange []kafka.Message // handed over but not produced by the test
	rec := record("m")
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		mu.Lock()
		for _, m := range msgs {
			v := string(m.Value)
			if !strings.HasPrefix(v, "commit-") && !strings.HasPrefix(v, "abort-") {
				strange = append(strange, m)
			}
		}
		mu.Unlock()
		return rec(ctx, tx, msgs)
	})
	var parked []string // EventParked keys
	cfg.with(partition.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == partition.EventParked {
			mu.Lock()
			parked = append(parked, e.Key)
			mu.Unlock()
		}
	})))
	m := startMember(t, b.pool, cfg)
	last := batches[len(batches)-1]
	testenv.Until(t, "the last transaction applied", func() (bool, error) {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE value LIKE $1`, last.Records[0].Value[:len("commit-8-")]+"%").Scan(&n)
		return n == len(last.Records), err
	})
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}

	rows, err := b.pool.Query(ctx, `SELECT value FROM results`)
	if err != nil {
		t.Fatal(err)
	}
	values, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		seen[v]++
	}
	applied, doubled, aborted := 0, 0, 0
	for v, n := range seen {
		switch {
		case !committed[v]:
			aborted++
			t.Errorf("applied %q, not a committed record", v)
		case n > 1:
			doubled++
			t.Errorf("applied %q %d times", v, n)
		default:
			applied++
		}
	}
	var nParked int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+partition.DefaultTable+`_parked`).Scan(&nParked); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("committed %d: applied %d, doubled %d, aborted applied %d; control records handed over %d; parked %d (events %d)",
		len(committed), applied, doubled, aborted, len(strange), nParked, len(parked))
	if applied != len(committed) || len(strange) != 0 || nParked != 0 || len(parked) != 0 {
		t.Fatalf("want every committed record applied once and nothing else; first handed-over control records: %v", strange[:min(3, len(strange))])
	}
}
