package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// logLines is a slog handler's output, safe for Run's goroutines.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the JSON records whose msg starts with prefix.
func (l *logLines) records(t *testing.T, prefix string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		var r map[string]any
		if line == "" {
			continue
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m, _ := r["msg"].(string); strings.HasPrefix(m, prefix) {
			out = append(out, r)
		}
	}
	return out
}

func jsonLogger(l *logLines) inbox.Option {
	return inbox.WithLogger(slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})))
}

// A consumer name reused for a second topic whose ids repeat the first's
// skips those messages: not silently. Stats counts each, and they are
// logged at Info once per batch with their number, never once per message.
func TestDuplicatesCountedAndLogged(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	var logs logLines
	in := newInbox(t, pool, jsonLogger(&logs))
	const n = 40
	var first, second []kafka.Message
	for i := range n {
		m := msg("order-"+string(rune('a'+i%26))+string(rune('a'+i/26)), 0, int64(i))
		first = append(first, m)
		m.Topic = "refunds" // the second topic, its ids the first's
		second = append(second, m)
	}
	if out, err := in.Process(context.Background(), first, record); err != nil || out.Processed != n {
		t.Fatalf("Process of the first topic: %+v, %v", out, err)
	}
	if out, err := in.Process(context.Background(), second[:10], record); err != nil || out.Duplicates != 10 {
		t.Fatalf("Process of 10 of the second topic: %+v, %v", out, err)
	}
	if recs := logs.records(t, "inbox: skipped"); len(recs) != 1 || recs[0]["level"] != "INFO" || recs[0]["duplicates"] != float64(10) || recs[0]["first"] != "refunds/0@0" || recs[0]["last"] != "refunds/0@9" {
		t.Fatalf("after one Process of 10 duplicates, logged %v; want one Info record of 10, refunds/0@0 to @9", recs)
	}
	runSlice(t, in, second[10:], record, func() bool { return in.Stats().Duplicates == n })
	st := in.Stats()
	if st.Processed != n || st.Duplicates != n || st.Parked != 0 || st.NoID != 0 {
		t.Errorf("Stats %+v; want %d processed, %d duplicates, nothing else", st, n, n)
	}
	recs := logs.records(t, "inbox: skipped")
	sum := 0.0
	for _, r := range recs {
		if r["level"] != "INFO" {
			t.Errorf("logged at %v, want INFO: %v", r["level"], r)
		}
		sum += r["duplicates"].(float64)
	}
	if sum != n || len(recs) > 1+(n-10) {
		t.Errorf("%d Info records counting %v duplicates; want %d in at most one record per batch", len(recs), sum, n)
	}
	if got := len(effects(t, pool)); got != n {
		t.Errorf("%d effects, want %d (the first topic's only)", got, n)
	}
}

// A producer that sets no id header: Run stops with an error naming the
// header and the last message's position once ten in a row lack it, and
// parks fewer than ten; the handler never runs. A few without one among
// messages with one are parked and counted, and Run goes on.
func TestMissingIdentityStopsRun(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	var logs logLines
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook, jsonLogger(&logs))
	var msgs []kafka.Message
	for i := range 1000 {
		msgs = append(msgs, msg("", 0, int64(i)))
	}
	calls := 0
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	err := in.Run(ctx, &sliceReader{msgs: msgs}, func(context.Context, pgx.Tx, kafka.Message) error { calls++; return nil })
	if !errors.Is(err, inbox.ErrNoID) || !strings.Contains(err.Error(), `no "id" header`) || !strings.Contains(err.Error(), "payments/0@") {
		t.Fatalf("Run: %v; want ErrNoID naming the header and the position", err)
	}
	st := in.Stats()
	if calls != 0 || parked.Load() > 9 || st.Parked != parked.Load() || st.NoID < 10 || st.NoID > 10+parked.Load() {
		t.Errorf("handler called %d times, %d parked, Stats %+v; want 0 calls, at most 9 parked, NoID from 10", calls, parked.Load(), st)
	}
	if recs := logs.records(t, "inbox: a message without identity"); len(recs) != 1 || recs[0]["level"] != "ERROR" {
		t.Errorf("logged %v; want one Error record at the first message without identity", recs)
	}

	// Interleaved: each without one is parked, the others applied.
	before := parked.Load()
	var mixed []kafka.Message
	for i := range 30 {
		id := "ok-" + string(rune('a'+i))
		if i%3 == 1 {
			id = ""
		}
		mixed = append(mixed, msg(id, 1, int64(i)))
	}
	runSlice(t, in, mixed, record, func() bool { return parked.Load() == before+10 && len(effects(t, pool)) == 20 })
}
