package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// BenchmarkConsume consumes b.N messages from the real broker, one effect
// row each, and reports msgs/s:
//
//	bare/batch=N    a consumer doing the same transaction per N messages, no inbox
//	inbox/batch=N   inbox.Run with WithMaxBatch(N): the same plus the claim
//
// Compare inbox against bare at the same batch size (scripts/bench prints
// the ratio against "bare" only for matching rows; read them in pairs).
func BenchmarkConsume(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("bare/batch=%d", batch), func(b *testing.B) {
			pool, r := consumeSetup(b)
			defer r.Close()
			b.ResetTimer()
			start := time.Now()
			for done := 0; done < b.N; {
				msgs := fetchBatch(b, r, min(batch, b.N-done))
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					for _, m := range msgs {
						if err := record(context.Background(), tx, m); err != nil {
							return err
						}
					}
					return nil
				})
				if err == nil {
					err = r.CommitMessages(context.Background(), msgs...)
				}
				if err != nil {
					b.Fatal(err)
				}
				done += len(msgs)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("inbox/batch=%d", batch), func(b *testing.B) {
			pool, r := consumeSetup(b)
			defer r.Close()
			in, err := inbox.New(pool, "bench", inbox.WithMaxBatch(batch), inbox.WithBatchWait(5*time.Millisecond))
			if err != nil {
				b.Fatal(err)
			}
			if err := in.CreateSchema(context.Background()); err != nil {
				b.Fatal(err)
			}
			cr := &countingReader{Reader: r}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			b.ResetTimer()
			start := time.Now()
			go func() {
				done <- in.Run(ctx, cr, record)
			}()
			for cr.committed.Load() < int64(b.N) { // offsets are committed after the transaction
				time.Sleep(time.Millisecond)
			}
			took := time.Since(start)
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/took.Seconds(), "msgs/s")
		})
	}
}

// consumeSetup produces b.N messages to a fresh topic and returns a pool
// with an effects table and a group reader on the topic.
func consumeSetup(b *testing.B) (*pgxpool.Pool, *kafka.Reader) {
	b.Helper()
	pool := testenv.Postgres(b)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (id text NOT NULL, payload text)`); err != nil {
		b.Fatal(err)
	}
	brokers, topic := testenv.Topic(b, 1)
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = fmt.Sprint("m", i)
	}
	produce(b, brokers, topic, ids, func(id string) string { return "v-" + id })
	return pool, groupReader(brokers, topic, testenv.Name("g"))
}

func fetchBatch(b *testing.B, r *kafka.Reader, n int) []kafka.Message {
	m, err := r.FetchMessage(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	msgs := []kafka.Message{m}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	for len(msgs) < n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			break
		}
		msgs = append(msgs, m)
	}
	return msgs
}
