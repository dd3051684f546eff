package nolockotel_test

// A workload on the real services (scripts/services) with a known number
// of conflicts, replays, parks and fenced refusals: the exported counts
// equal those numbers.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/partition"
)

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// Compare-and-set transactions that lose a known number of times, and
// idempotent requests repeated with one key, under a caller's span: the
// conflicts, retries, give-ups, commits, runs and replays are counted
// exactly, and the library's spans are children of the caller's.
func TestWorkloadPostgres(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool, _ := testenv.PostgresSchema(t, 8)
	ctx, caller := b.tp.Tracer("test").Start(context.Background(), "caller")

	exec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, version bigint NOT NULL)`)
	exec(t, pool, `INSERT INTO docs VALUES (1, '', 1)`)
	// edit loses its first lose attempts: another writer moves the
	// version between its read and its write.
	edit := func(lose int) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			var version int64
			if err := tx.QueryRow(ctx, `SELECT version FROM docs WHERE id = 1`).Scan(&version); err != nil {
				return err
			}
			if lose > 0 {
				lose--
				exec(t, pool, `UPDATE docs SET version = version + 1 WHERE id = 1`)
			}
			return pgcas.Exec(ctx, tx, `UPDATE docs SET body = 'x', version = version + 1 WHERE id = 1 AND version = $1`, version)
		}
	}
	opts := []cas.Option{cas.WithObserver(b.a), cas.WithBackoff(time.Millisecond, 2*time.Millisecond)}
	conflicts, commits := 0, 0
	for _, lose := range []int{1, 2, 0, 3} {
		if err := pgcas.Retry(ctx, pool, edit(lose), opts...); err != nil {
			t.Fatal(err)
		}
		conflicts += lose
		commits++
	}
	retries := conflicts
	// Out of attempts: two conflicts, one retry between them, a give-up.
	if err := pgcas.Retry(ctx, pool, edit(1000), append(opts, cas.WithAttempts(2))...); !errors.Is(err, cas.ErrConflict) {
		t.Fatalf("Retry that always loses: %v, want ErrConflict", err)
	}
	conflicts += 2
	retries++

	store, err := idempotency.New(pool, idempotency.WithObserver(b.a))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for range n {
		if _, err := store.Do(ctx, "orders", "order-1", []byte("req"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, inner := b.tp.Tracer("test").Start(ctx, "fn")
			inner.End()
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Do(ctx, "orders", "order-1", []byte("another"), func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		return nil, errors.New("must not run")
	}); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("Do with another request: %v, want ErrMismatch", err)
	}
	caller.End()

	m := b.collect(t)
	equalMaps(t, nolockotel.MetricOutcomes, byEvent(m.counts(t)), map[string]int64{
		"cas.conflict": int64(conflicts), // 1+2+0+3 + 2
	})
	equalMaps(t, nolockotel.MetricRetries, m.counts(t, nolockotel.MetricRetries), map[string]int64{"cas.retry/cas.ErrConflict": int64(retries)})
	calls := map[string]int64{}
	for k, v := range histogram[float64](t, m, nolockotel.MetricOperationDuration) {
		calls[k] = int64(v[0])
	}
	equalMaps(t, nolockotel.MetricOperationDuration+" (count)", calls, map[string]int64{
		"cas.committed":                                int64(commits),
		"cas.gave_up/cas.ErrConflict":                  1,
		"idempotency.ran":                              1,
		"idempotency.replayed":                         n - 1,
		"idempotency.mismatch/idempotency.ErrMismatch": 1,
	})
	t.Logf("%s: %v", nolockotel.MetricOutcomes, m.counts(t))
	if got := histogram[int64](t, m, nolockotel.MetricBatchSize)["cas.committed"]; got != [2]float64{float64(commits), float64(commits)} {
		t.Errorf("nolock.batch.size for cas.committed (count, sum) = %v, want %d Retry commits of 1", got, commits)
	}
	// Every call is a span under the caller's, and a span fn starts is
	// under its Do's.
	spans := map[string]int{}
	names := map[trace.SpanID]string{}
	for _, s := range b.spans.Ended() {
		names[s.SpanContext().SpanID()] = s.Name()
	}
	for _, s := range b.spans.Ended() {
		spans[s.Name()]++
		switch parent := names[s.Parent().SpanID()]; {
		case s.Name() == "fn" && parent != idempotency.CallDo,
			s.Name() != "fn" && s.Name() != "caller" && s.Parent().SpanID() != caller.SpanContext().SpanID():
			t.Errorf("span %s: parent %v (%s)", s.Name(), s.Parent().SpanID(), parent)
		}
	}
	equalMaps(t, "spans", spans, map[string]int{"caller": 1, cas.CallRetry: commits + 1, idempotency.CallDo: n + 1, "fn": 1})
}

// A partition consumer that parks its poison messages (one attempt each)
// and is fenced once (its epoch bumped behind its back): parks and fenced
// refusals are counted exactly, and the committed batches' sizes add up
// to the messages applied.
func TestWorkloadKafka(t *testing.T) {
	t.Parallel()
	b := newBed(t)
	pool, _ := testenv.PostgresSchema(t, 8)
	brokers, topic := testenv.Topic(t, 1)
	group := testenv.Name("g")

	const n, poisons = 20, 3 // messages 5, 10 and 15 are poison
	value := func(i int) string {
		if i > 0 && i%5 == 0 && i < n {
			return fmt.Sprint("poison-", i)
		}
		return fmt.Sprint("m-", i)
	}
	produce(t, brokers, topic, value, 0, n)

	exec(t, pool, `CREATE TABLE results (msg_offset bigint PRIMARY KEY, value text NOT NULL)`)
	handler := func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs {
			if strings.HasPrefix(string(m.Value), "poison") {
				return errors.New("poison")
			}
			if _, err := tx.Exec(ctx, `INSERT INTO results VALUES ($1, $2)`, m.Offset, string(m.Value)); err != nil {
				return err
			}
		}
		return nil
	}
	c, err := partition.New(pool, brokers, group, []string{topic},
		partition.WithAttempts(1), partition.WithObserver(b.a),
		partition.WithMaxBatch(10), partition.WithHeartbeatInterval(200*time.Millisecond),
		partition.WithSessionTimeout(6*time.Second), partition.WithRebalanceTimeout(3*time.Second),
		partition.WithJoinGroupBackoff(200*time.Millisecond), partition.WithBatchTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	runCtx, consumer := b.tp.Tracer("test").Start(context.Background(), "consume")
	runCtx, stop := context.WithCancel(runCtx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, handler) }()
	var runErr error
	stopRun := sync.OnceFunc(func() { stop(); runErr = <-done })
	t.Cleanup(stopRun)

	waitRows(t, pool, n-poisons)
	// Another owner's claim, as far as the fence can tell: the worker's
	// next batch is refused; it claims again and applies it.
	exec(t, pool, `UPDATE `+partition.DefaultTable+` SET epoch = epoch + 1 WHERE group_id = $1`, group)
	produce(t, brokers, topic, value, n, 1)
	waitRows(t, pool, n-poisons+1)
	stopRun()
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		t.Fatalf("Run: %v", runErr)
	}
	consumer.End()

	m := b.collect(t)
	counts := byEvent(m.counts(t))
	t.Logf("%s: %v", nolockotel.MetricOutcomes, m.counts(t))
	if counts["partition.parked"] != poisons {
		t.Errorf("partition.parked counted %d, want %d", counts["partition.parked"], poisons)
	}
	if counts["partition.fenced"] != 1 {
		t.Errorf("partition.fenced counted %d, want 1", counts["partition.fenced"])
	}
	if counts["partition.claimed"] < 2 || counts["partition.released"] != counts["partition.claimed"] {
		t.Errorf("partition.claimed %d, released %d: want at least 2, each released", counts["partition.claimed"], counts["partition.released"])
	}
	for k, v := range histogram[float64](t, m, nolockotel.MetricProcessDuration) {
		event, attrs, _ := strings.Cut(k, " ")
		if want := "messaging.destination.name=" + topic + " messaging.destination.partition.id=0 messaging.operation.name=process messaging.system=kafka"; attrs != want {
			t.Errorf("%s: series %q, want %q", nolockotel.MetricProcessDuration, k, want)
		}
		if event == "partition.committed" {
			counts["partition.committed"] += int64(v[0])
		}
	}
	committed := histogram[int64](t, m, nolockotel.MetricBatchSize)["partition.committed"]
	if committed[0] != float64(counts["partition.committed"]) || committed[1] != n-poisons+1 {
		t.Errorf("nolock.batch.size for partition.committed (count, sum) = %v, want %d batches adding up to %d messages",
			committed, counts["partition.committed"], n-poisons+1)
	}
	// The consumer's batches are consumer spans under the span Run was
	// called in (the messages carry no trace context).
	batches := map[string]int64{}
	for _, s := range b.spans.Ended() {
		if s.Name() != partition.CallHandle {
			continue
		}
		for _, kv := range s.Attributes() {
			if kv.Key == nolockotel.AttrEvent {
				batches[kv.Value.AsString()]++
			}
		}
		if s.Parent().SpanID() != consumer.SpanContext().SpanID() || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("partition.handle span's parent %v, kind %v: want Run's caller's %v, consumer", s.Parent().SpanID(), s.SpanKind(), consumer.SpanContext().SpanID())
		}
	}
	if batches["partition.committed"] != counts["partition.committed"] {
		t.Errorf("%d partition.handle spans ending partition.committed, want %d", batches["partition.committed"], counts["partition.committed"])
	}
}

// produce writes the messages value(first) … value(first+count-1).
func produce(t *testing.T, brokers []string, topic string, value func(int) string, first, count int) {
	t.Helper()
	msgs := make([]kafka.Message, count)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: []byte(value(first + i))}
	}
	produceMsgs(t, brokers, topic, msgs)
}

// produceMsgs writes msgs, in order, retrying while the new topic's
// leader is not yet serving.
func produceMsgs(t *testing.T, brokers []string, topic string, msgs []kafka.Message) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll,
		BatchSize: 1000, BatchTimeout: 5 * time.Millisecond, MaxAttempts: 1}
	defer w.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := w.WriteMessages(ctx, msgs...)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("produce to %s: %v", topic, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRows waits until results holds n rows.
func waitRows(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	var got int
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM results`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
	}
	t.Fatalf("results holds %d rows, want %d", got, n)
}
