package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// What Process and Run do reaches the observer: the messages applied and
// the duplicates skipped add up to the batches given, a poison message is
// retried then parked, and a panicking observer breaks nothing.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	rec := &testenv.Events{}
	in := newInbox(t, pool, inbox.WithAttempts(2), inbox.WithObserver(observe.Func(func(ctx context.Context, e observe.Event) {
		rec.Observe(ctx, e)
		panic("a broken observer")
	})))
	batch := []kafka.Message{msg("a", 0, 0), msg("b", 0, 1), msg("c", 0, 2)}
	for range 2 {
		if _, err := in.Process(ctx, batch, record); err != nil {
			t.Fatal(err)
		}
	}
	poisoned := errors.New("poison")
	msgs := []kafka.Message{msg("d", 0, 3), msg("bad", 0, 4), msg("e", 0, 5)}
	runSlice(t, in, msgs, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Headers[0].Value) == "bad" {
			return poisoned
		}
		return record(ctx, tx, m)
	}, func() bool { return len(rec.Of("payments/0@4", inbox.EventParked)) == 1 && applied(rec) == 5 })

	if n := applied(rec); n != 5 {
		t.Errorf("committed events carry %d messages, want 5 (a, b, c, d, e)", n)
	}
	var dup int64
	for _, e := range rec.Of("payments/0", inbox.EventDuplicate) {
		dup += e.N
	}
	if dup != 3 {
		t.Errorf("duplicate events carry %d messages, want 3 (the second batch)", dup)
	}
	if p := rec.Of("payments/0@4", inbox.EventParked); len(p) != 1 || p[0].N != 1 || p[0].Attempt != 2 || !errors.Is(p[0].Err, poisoned) {
		t.Errorf("parked events of offset 4 %+v: want one, after 2 attempts, with the handler's error", p)
	}
	if len(rec.Of("payments/0", inbox.EventRetry)) == 0 {
		t.Errorf("no retry event for the poison's first failure")
	}
}

// applied sums the messages of rec's inbox.committed events.
func applied(rec *testenv.Events) int64 {
	var n int64
	for _, e := range rec.Of("payments/0", inbox.EventCommitted) {
		n += e.N
	}
	return n
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{inbox.EventCommitted, "inbox.committed"},
		{inbox.EventDuplicate, "inbox.duplicate"},
		{inbox.EventRetry, "inbox.retry"},
		{inbox.EventParked, "inbox.parked"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
