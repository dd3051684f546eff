package nolockotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/nolockotel"
)

// Inject writes the producer's span into a message's headers (replacing a
// stale traceparent, keeping the others, leaving the caller's slice
// alone); the message goes through Kafka; Extract, on the headers read
// back, gives the producer's span as the remote parent. A context without
// a span injects nothing.
func TestInjectExtract(t *testing.T) {
	t.Parallel()
	b := newBed(t, nolockotel.WithPropagator(propagation.TraceContext{}))
	brokers, topic := testenv.Topic(t, 1)
	ctx, producer := b.tp.Tracer("test").Start(context.Background(), "produce")
	defer producer.End()

	stale := []kafka.Header{{Key: "id", Value: []byte("order-1")}, {Key: "traceparent", Value: []byte("00-stale")}}
	m := kafka.Message{Value: []byte("v"), Headers: stale}
	b.a.Inject(ctx, &m)
	if string(stale[1].Value) != "00-stale" {
		t.Errorf("Inject changed the caller's slice: %q", stale)
	}
	keys := map[string]int{}
	for _, h := range m.Headers {
		keys[h.Key]++
	}
	if keys["id"] != 1 || keys["traceparent"] != 1 || len(keys) != 2 {
		t.Errorf("headers after Inject: %q, want id and one traceparent", m.Headers)
	}

	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	testenv.Until(t, "the message written", func() (bool, error) {
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return w.WriteMessages(wctx, m) == nil, nil
	})
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := r.ReadMessage(rctx)
	if err != nil {
		t.Fatal(err)
	}

	sc := trace.SpanContextFromContext(b.a.Extract(context.Background(), got.Headers))
	want := producer.SpanContext()
	if !sc.IsRemote() || sc.TraceID() != want.TraceID() || sc.SpanID() != want.SpanID() || sc.TraceFlags() != want.TraceFlags() {
		t.Errorf("extracted %+v, want the producer's span %+v as remote", sc, want)
	}

	var none kafka.Message
	b.a.Inject(context.Background(), &none)
	if len(none.Headers) != 0 {
		t.Errorf("Inject without a span wrote %q", none.Headers)
	}
	if sc := trace.SpanContextFromContext(b.a.Extract(context.Background(), nil)); sc.IsValid() {
		t.Errorf("Extract of no headers: %+v, want none", sc)
	}
}
