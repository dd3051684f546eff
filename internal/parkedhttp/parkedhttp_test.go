package parkedhttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/kafkapark"
)

var (
	errInvalid   = errors.New("x: invalid argument")
	errNotParked = errors.New("x: no such parked message")
	errAmbiguous = errors.New("x: commit outcome unknown")
	errHandler   = errors.New("x: handler failed")
)

// fake answers with err, counting the calls that reach it.
func fake(err error, calls *int) Backend {
	return Backend{
		List:       func(context.Context, kafkapark.ID, int) ([]Message, error) { *calls++; return nil, err },
		Replay:     func(context.Context, kafkapark.ID) error { *calls++; return err },
		Purge:      func(context.Context, kafkapark.ID) error { *calls++; return err },
		PurgeOlder: func(context.Context, time.Duration) (int64, error) { *calls++; return 0, err },
		Consumer:   func() Consumer { *calls++; return Consumer{Kind: KindInbox, Name: "c"} },
		Invalid:    errInvalid, NotParked: errNotParked, Ambiguous: errAmbiguous,
		HandlerFailed: func(e error) bool { return errors.Is(e, errHandler) },
	}
}

// Each request gets its status and code; a bad request never reaches the
// backend.
func TestHandlerStatuses(t *testing.T) {
	for _, tc := range []struct {
		method, target string
		err            error
		status         int
		code           string
		reaches        bool
	}{
		{"GET", "/", nil, 200, "", true},
		{"GET", "/?limit=0", nil, 400, CodeInvalid, false},
		{"GET", "/?limit=1001", nil, 400, CodeInvalid, false},
		{"GET", "/?after=t/0", nil, 400, CodeInvalid, false},
		{"POST", "/", nil, 405, CodeMethod, false},
		{"GET", "/replay?id=t/0@1", nil, 405, CodeMethod, false},
		{"POST", "/replay?id=t/0@1", nil, 200, "", true},
		{"POST", "/replay?id=t/0@x", nil, 400, CodeInvalid, false},
		{"POST", "/replay?id=t/0@1", errNotParked, 404, CodeNotParked, true},
		{"POST", "/replay?id=t/0@1", errHandler, 422, CodeHandlerFailed, true},
		{"POST", "/replay?id=t/0@1", errAmbiguous, 500, CodeAmbiguous, true},
		{"POST", "/replay?id=t/0@1", errInvalid, 400, CodeInvalid, true},
		{"POST", "/replay?id=t/0@1", errors.New("boom"), 500, CodeInternal, true},
		{"POST", "/a/b/purge?id=t/0@1", nil, 200, "", true},
		{"POST", "/purge?older_than=1h", nil, 200, "", true},
		{"POST", "/purge?older_than=-1h", nil, 400, CodeInvalid, false},
		{"POST", "/purge", nil, 400, CodeInvalid, false},
		{"POST", "/purge?id=t/0@1&older_than=1h", nil, 400, CodeInvalid, false},
		{"GET", "/consumer", nil, 200, "", true},
		{"GET", "/admin/parked/consumer", nil, 200, "", true},
		{"POST", "/consumer", nil, 405, CodeMethod, false},
		{"GET", "/consumer/", nil, 200, "", true},                  // mounted at .../consumer/: lists
		{"POST", "/replay/?id=t/0@1", nil, 405, CodeMethod, false}, // the list of a handler mounted at .../replay/
	} {
		calls := 0
		rec := httptest.NewRecorder()
		Handler(fake(tc.err, &calls)).ServeHTTP(rec, httptest.NewRequest(tc.method, tc.target, nil))
		var e Error
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != tc.status || e.Code != tc.code || (calls == 1) != tc.reaches || calls > 1 {
			t.Errorf("%s %s (%v): %d %q, %d calls; want %d %q, reaches %v", tc.method, tc.target, tc.err, rec.Code, e.Code, calls, tc.status, tc.code, tc.reaches)
		}
	}
}

// The key's and value's previews are bounded and never cuts a rune in two; the size is the
// whole value's.
func TestSummaryPreview(t *testing.T) {
	for _, n := range []int{0, 10, PreviewBytes, PreviewBytes + 1, 4 * PreviewBytes} {
		for _, unit := range []string{"a", "é", "€", "😀", "\xff"} {
			v := strings.Repeat(unit, n/len(unit)+1)
			s := Summary(kafka.Message{Topic: "t", Key: []byte(v), Value: []byte(v)}, time.Time{}, 1, "e", "", 0)
			if s.Key != s.Value {
				t.Errorf("%d × %q: key preview %q, value preview %q: want the same", n, unit, s.Key, s.Value)
			}
			if !utf8.ValidString(s.Value) || len(s.Value) > PreviewBytes*3 || s.ValueSize != len(v) {
				t.Errorf("%d × %q: preview of %d bytes (valid %v), size %d", n, unit, len(s.Value), utf8.ValidString(s.Value), s.ValueSize)
			}
			if unit != "\xff" && (!strings.HasPrefix(v, s.Value) || len(s.Value) > PreviewBytes || len(v) > PreviewBytes && len(s.Value) < PreviewBytes-3) {
				t.Errorf("%d × %q: preview %d bytes of %d, not a prefix of at most %d", n, unit, len(s.Value), len(v), PreviewBytes)
			}
		}
	}
}

// The consumer call answers the backend's Consumer as JSON, in the names
// the CLI decodes, topics an array even when none is known.
func TestHandlerConsumer(t *testing.T) {
	b := fake(nil, new(int))
	b.Consumer = func() Consumer {
		return Consumer{Kind: KindPartition, Name: "g", Group: "g", IsolationLevel: Isolation(kafka.ReadCommitted), Running: true, Partitions: 3}
	}
	rec := httptest.NewRecorder()
	Handler(b).ServeHTTP(rec, httptest.NewRequest("GET", "/admin/parked/consumer", nil))
	want := `{"kind":"partition","name":"g","group":"g","topics":[],"isolation_level":"read_committed","running":true,"partitions":3}`
	if got := strings.TrimSpace(rec.Body.String()); rec.Code != 200 || got != want {
		t.Errorf("got %d %s, want 200 %s", rec.Code, got, want)
	}
	if Isolation(kafka.ReadUncommitted) != ReadUncommitted || Isolation(0) != ReadUncommitted {
		t.Errorf("kafka-go's zero IsolationLevel is read uncommitted: got %q", Isolation(0))
	}
}
