package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// Each handler's run on a message is a call: Start gets the message
// (topic, partition, offset, the headers the producer set), the handler
// gets the context Start returned, and End gets it once, with the
// handler's outcome, a panic included: in Run (recovered, then parked)
// and in Process (End, then the panic goes on to Process's caller).
func TestCalls(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	calls := &testenv.Calls{}
	in := newInbox(t, pool, inbox.WithAttempts(1), inbox.WithObserver(calls))
	brokers, topic := testenv.Topic(t, 1)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tr := &kafka.Transport{}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr}
	err := w.WriteMessages(context.Background(),
		kafka.Message{Value: []byte("ok"), Headers: []kafka.Header{{Key: "id", Value: []byte("ok")}, {Key: "traceparent", Value: []byte(traceparent)}}},
		kafka.Message{Value: []byte("panics"), Headers: []kafka.Header{{Key: "id", Value: []byte("panics")}, {Key: "traceparent", Value: []byte(traceparent)}}},
	)
	_ = w.Close()
	tr.CloseIdleConnections()
	if err != nil {
		t.Fatal(err)
	}
	r := groupReader(brokers, topic, testenv.Name("g"))
	defer r.Close()
	var outside int
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if _, ok := testenv.CallOf(ctx); !ok {
			outside++
		}
		if string(m.Value) == "panics" {
			panic("handler")
		}
		return record(ctx, tx, m)
	}
	runUntil(t, in, r, h, func() bool {
		return count(t, pool, `SELECT count(*) FROM effects`) == 1 && count(t, pool, `SELECT count(*) FROM nolock_inbox_parked`) == 1
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not reach Process's caller")
			}
		}()
		_, _ = in.Process(context.Background(), []kafka.Message{msg("direct", 0, 7)}, func(context.Context, pgx.Tx, kafka.Message) error { panic("handler") })
	}()
	if outside != 0 {
		t.Errorf("the handler ran %d times without its call's ctx", outside)
	}
	got := calls.Ended(t)
	var handled, failed int
	for i, c := range got {
		m := c.Message
		if m == nil {
			t.Fatalf("call %d (%s %q) has no Message", i+1, c.Name, c.Key)
		}
		if c.Name != inbox.CallHandle || c.Event.Key != c.Key {
			t.Errorf("call %d: %s %q ended with %+v; want %s, its Key", i+1, c.Name, c.Key, c.Event, inbox.CallHandle)
		}
		if m.Topic == "payments" { // Process's
			if c.Key != "payments/0@7" || c.Event.Name != inbox.EventHandleFailed || c.Event.Err == nil {
				t.Errorf("Process's call %q ended with %+v, want handle_failed", c.Key, c.Event)
			}
			continue
		}
		if m.Topic != topic || m.Partition != 0 || len(m.Headers) != 2 || m.Headers[1].Key != "traceparent" || string(m.Headers[1].Value) != traceparent {
			t.Errorf("call %d's Message %+v: want the produced message with its traceparent", i+1, m)
		}
		var pe *inbox.PanicError
		switch {
		case m.Offset == 0 && c.Event.Name == inbox.EventHandled && c.Event.Err == nil:
			handled++
		case m.Offset == 1 && c.Event.Name == inbox.EventHandleFailed && errors.As(c.Event.Err, &pe):
			failed++
		default:
			t.Errorf("call %d (offset %d) ended with %+v", i+1, m.Offset, c.Event)
		}
	}
	if handled < 1 || failed < 1 {
		t.Errorf("%d calls handled the first message and %d failed on the second, want at least 1 each", handled, failed)
	}
}
