package partition

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkBatchTransaction isolates the fence's cost from Kafka: 4
// workers (one per partition row) commit batches of 1 and of 10 rows back to back,
// either through the Consumer's batch transaction (fence with the idle
// timeout in one statement, handler, commit) or through the bare
// transaction of BenchmarkThroughput's baseline (handler, offset upsert,
// commit), with a BatchTimeout deadline in both. Rounds of each
// alternate; x-bare is the median round's ratio.
func BenchmarkBatchTransaction(b *testing.B) {
	for _, batch := range []int{1, 10} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchBatchTransaction(b, batch) })
	}
}

func benchBatchTransaction(b *testing.B, batch int) {
	const workers, round = 4, 300 * time.Millisecond
	ctx := context.Background()
	pool := testenv.Postgres(b)
	insert := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		offs := make([]int64, len(msgs))
		for i, m := range msgs {
			offs[i] = m.Offset
		}
		_, err := tx.Exec(ctx, `INSERT INTO results (p, o) SELECT $1, o FROM unnest($2::bigint[]) AS u(o)`, msgs[0].Partition, offs)
		return err
	}
	c, err := New(pool, []string{"unused:9092"}, "g", []string{"t"})
	if err != nil {
		b.Fatal(err)
	}
	c.handler = insert // what Run would set
	if err := c.CreateSchema(ctx); err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{
		`CREATE TABLE results (p int, o bigint)`,
		`CREATE TABLE bare_offsets (group_id text, topic text, partition_id int, next_offset bigint, PRIMARY KEY (group_id, topic, partition_id)) WITH (fillfactor = 70)`,
		`INSERT INTO nolock_partition (group_id, topic, partition_id, epoch, next_offset) SELECT 'g', 't', p, 1, 0 FROM generate_series(0, 3) p`,
		`INSERT INTO bare_offsets SELECT 'g', 't', p, 0 FROM generate_series(0, 3) p`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	nextF, nextB := make([]int64, workers), make([]int64, workers) // each worker's own
	msgsAt := func(p int, from int64) []kafka.Message {
		msgs := make([]kafka.Message, batch)
		for i := range msgs {
			msgs[i] = kafka.Message{Topic: "t", Partition: p, Offset: from + int64(i)}
		}
		return msgs
	}
	fenced := func(p int) error {
		msgs := msgsAt(p, nextF[p])
		prev, end := nextF[p], nextF[p]+int64(batch)
		if _, _, err := c.apply(ctx, Claim{GroupID: "g", Topic: "t", Partition: p, Epoch: 1}, &prev, end, msgs); err != nil {
			return err
		}
		nextF[p] = end
		return nil
	}
	bare := func(p int) error {
		msgs := msgsAt(p, nextB[p])
		end := nextB[p] + int64(batch)
		ctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout) // bounded, as in the Consumer
		defer cancel()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := insert(ctx, tx, msgs); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO bare_offsets VALUES ('g', 't', $1, $2)
				ON CONFLICT (group_id, topic, partition_id) DO UPDATE SET next_offset = EXCLUDED.next_offset`, p, end)
			return err
		}); err != nil {
			return err
		}
		nextB[p] = end
		return nil
	}
	// runRound runs op on every worker for one round and returns batches/s.
	runRound := func(op func(p int) error) float64 {
		deadline := time.Now().Add(round)
		errs := make(chan error, workers)
		counts := make(chan int, workers)
		start := time.Now()
		for p := 0; p < workers; p++ {
			go func() {
				n := 0
				for time.Now().Before(deadline) {
					if err := op(p); err != nil {
						errs <- err
						counts <- n
						return
					}
					n++
				}
				errs <- nil
				counts <- n
			}()
		}
		total := 0
		for p := 0; p < workers; p++ {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			total += <-counts
		}
		return float64(total) / time.Since(start).Seconds()
	}
	var ratios []float64
	var sumF, sumB float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var f, r float64
		if i%2 == 0 {
			r, f = runRound(bare), runRound(fenced)
		} else {
			f, r = runRound(fenced), runRound(bare)
		}
		sumF, sumB = sumF+f, sumB+r
		ratios = append(ratios, f/r)
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.Logf("fenced/bare per round, sorted: %s", fmt.Sprintf("%.3f", ratios))
	b.ReportMetric(sumF/float64(b.N)*float64(batch), "fenced-msgs/s")
	b.ReportMetric(sumB/float64(b.N)*float64(batch), "bare-msgs/s")
	b.ReportMetric(ratios[len(ratios)/2], "x-bare")
}
