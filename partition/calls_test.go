package partition_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// Each batch is a call: Start gets its first message, the Handler gets the
// context Start returned (in every attempt), the batch's retries come in
// the call, and End gets it once: committed for each batch applied (their
// messages add up to those applied), failed with the error for the
// batches that did not commit.
func TestCalls(t *testing.T) {
	t.Parallel()
	const n, poison = 20, "0-7"
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, n)
	calls := &testenv.Calls{}
	apply := record("m")
	var outside int
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if _, ok := testenv.CallOf(ctx); !ok {
			outside++ // one worker: no race
		}
		for _, m := range msgs {
			if string(m.Value) == poison {
				return errors.New("poison")
			}
		}
		return apply(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(2), partition.WithObserver(calls))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(context.Background(), b.pool, n-1); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if outside != 0 {
		t.Errorf("the Handler ran %d times without its call's ctx", outside)
	}
	var committed int64
	var failed int
	for i, c := range calls.Ended(t) {
		if c.Name != partition.CallHandle || c.Key != b.topic+"/0" || c.Message == nil || c.Message.Topic != b.topic || c.Event.Key != c.Key {
			t.Fatalf("call %d: %s %q (message %+v) ended with %+v", i+1, c.Name, c.Key, c.Message, c.Event)
		}
		switch c.Event.Name {
		case partition.EventCommitted:
			committed += c.Event.N
		case partition.EventFailed:
			if c.Event.Err == nil {
				t.Errorf("call %d failed without its error", i+1)
			}
			failed++
		default:
			t.Errorf("call %d ended with %+v", i+1, c.Event)
		}
	}
	if committed != n-1 || failed < 1 { // the poison's (and its batch's, if it had one)
		t.Errorf("calls committed %d messages and %d failed; want %d, and 1 failed at least", committed, failed, n-1)
	}
	if in, _ := calls.Events(); in < 1 {
		t.Errorf("%d events in calls, want the poison's retry at least", in)
	}
}
