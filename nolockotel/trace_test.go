package nolockotel_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/nolockotel"
	"github.com/nolock/nolock/partition"
)

// queryTracer is a pgx QueryTracer that starts a span for each query
// from the query's context, as a tracing library for pgx does.
type queryTracer struct{ tracer trace.Tracer }

type querySpan struct{}

func (q queryTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	ctx, span := q.tracer.Start(ctx, "db.query", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.query.text", data.SQL)))
	return context.WithValue(ctx, querySpan{}, span)
}

func (q queryTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if span, ok := ctx.Value(querySpan{}).(trace.Span); ok {
		span.End()
	}
}

// traced returns a pool on a fresh schema whose queries are spans of
// b's tracer provider.
func traced(t *testing.T, b *bed) *pgxpool.Pool {
	t.Helper()
	_, schema := testenv.PostgresSchema(t, 2)
	return testenv.PoolWith(t, testenv.PostgresDSNFor(t, schema), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		cfg.ConnConfig.Tracer = queryTracer{b.tp.Tracer("pgx")}
	})
}

// produceTraced writes one message with the id header, inside a producer
// span whose context a.Inject puts in its headers, and returns that span.
func produceTraced(t *testing.T, b *bed, brokers []string, topic string) trace.SpanContext {
	t.Helper()
	ctx, span := b.tp.Tracer("producer").Start(context.Background(), "send", trace.WithSpanKind(trace.SpanKindProducer))
	msg := kafka.Message{Value: []byte("v"), Headers: []kafka.Header{{Key: "id", Value: []byte("m-1")}}}
	b.a.Inject(ctx, &msg)
	produceMsgs(t, brokers, topic, []kafka.Message{msg})
	span.End()
	return span.SpanContext()
}

// oneTrace checks that the spans named call and the query span whose SQL
// has marker form one trace under the producer's span: producer → call
// (a consumer span, its child) → the query (the call's child).
func oneTrace(t *testing.T, b *bed, producer trace.SpanContext, call, marker string) {
	t.Helper()
	var calls, queries []sdktrace.ReadOnlySpan
	for _, s := range b.spans.Ended() {
		switch {
		case s.Name() == call:
			calls = append(calls, s)
		case s.Name() == "db.query":
			for _, kv := range s.Attributes() {
				if kv.Key == "db.query.text" && strings.Contains(kv.Value.AsString(), marker) {
					queries = append(queries, s)
				}
			}
		}
	}
	if len(calls) != 1 || len(queries) != 1 {
		t.Fatalf("%d %s spans and %d handler query spans, want one each", len(calls), call, len(queries))
	}
	c, q := calls[0], queries[0]
	if c.SpanContext().TraceID() != producer.TraceID() || q.SpanContext().TraceID() != producer.TraceID() {
		t.Errorf("traces: producer %v, %s %v, query %v: want one", producer.TraceID(), call, c.SpanContext().TraceID(), q.SpanContext().TraceID())
	}
	if c.Parent().SpanID() != producer.SpanID() || !c.Parent().IsRemote() {
		t.Errorf("%s's parent %v (remote %v), want the producer's span %v, remote", call, c.Parent().SpanID(), c.Parent().IsRemote(), producer.SpanID())
	}
	if c.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("%s: kind %v, want consumer", call, c.SpanKind())
	}
	if q.Parent().SpanID() != c.SpanContext().SpanID() {
		t.Errorf("the handler's query's parent %v, want the %s span %v", q.Parent().SpanID(), call, c.SpanContext().SpanID())
	}
}

// One message, from a kafka-go producer's span through inbox.Run into
// the handler's pgx query, is one trace: producer → inbox.handle → query.
func TestTraceInbox(t *testing.T) {
	t.Parallel()
	b := newBed(t, nolockotel.WithPropagator(propagation.TraceContext{}))
	pool := traced(t, b)
	brokers, topic := testenv.Topic(t, 1)
	producer := produceTraced(t, b, brokers, topic)

	group := testenv.Name("g")
	in, err := inbox.New(pool, group, inbox.WithObserver(b.a))
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group, StartOffset: kafka.FirstOffset,
		MaxWait: 100 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 6 * time.Second, JoinGroupBackoff: 200 * time.Millisecond})
	defer r.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- in.Run(ctx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
			_, err := tx.Exec(ctx, `SELECT 'inbox-handler'`)
			return err
		})
	}()
	for deadline := time.Now().Add(testenv.Scale(time.Minute)); in.Stats().Processed < 1; {
		if time.Now().After(deadline) {
			t.Fatal("the message not processed within a minute")
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	oneTrace(t, b, producer, inbox.CallHandle, "inbox-handler")
}

// One message, from a kafka-go producer's span through a partition
// Consumer into the handler's pgx query, is one trace: producer →
// partition.handle (the batch: its first message's context) → query.
func TestTracePartition(t *testing.T) {
	t.Parallel()
	b := newBed(t, nolockotel.WithPropagator(propagation.TraceContext{}))
	pool := traced(t, b)
	brokers, topic := testenv.Topic(t, 1)
	producer := produceTraced(t, b, brokers, topic)

	c, err := partition.New(pool, brokers, testenv.Name("g"), []string{topic}, partition.WithObserver(b.a),
		partition.WithHeartbeatInterval(200*time.Millisecond), partition.WithSessionTimeout(6*time.Second),
		partition.WithRebalanceTimeout(3*time.Second), partition.WithJoinGroupBackoff(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
			_, err := tx.Exec(ctx, `SELECT 'partition-handler'`)
			return err
		})
	}()
	waitCommitted(t, b, done)
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	oneTrace(t, b, producer, partition.CallHandle, "partition-handler")
}

// waitCommitted waits until a partition.handle span has ended.
func waitCommitted(t *testing.T, b *bed, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(testenv.Scale(time.Minute))
	for {
		for _, s := range b.spans.Ended() {
			if s.Name() == partition.CallHandle {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no partition.handle span within a minute")
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
