package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// sliceReader hands out msgs in order, then blocks until ctx ends: Run
// without Kafka, for tests of what Run does with odd messages.
type sliceReader struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

func (s *sliceReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	s.mu.Lock()
	if len(s.msgs) > 0 {
		m := s.msgs[0]
		s.msgs = s.msgs[1:]
		s.mu.Unlock()
		return m, nil
	}
	s.mu.Unlock()
	<-ctx.Done()
	return kafka.Message{}, ctx.Err()
}

func (s *sliceReader) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// runSlice runs in over msgs until done holds (runUntil: at most a
// minute), then stops Run.
func runSlice(t *testing.T, in *inbox.Inbox, msgs []kafka.Message, h inbox.Handler, done func() bool) {
	t.Helper()
	runUntil(t, in, &sliceReader{msgs: msgs}, h, done)
}

// parkCounter is an observer that counts EventParked.
func parkCounter() (*atomic.Int64, inbox.Option) {
	var n atomic.Int64
	return &n, inbox.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
		if e.Name == inbox.EventParked {
			n.Add(1)
		}
	}))
}

// Identities PostgreSQL cannot store as text (a raw binary UUID, a NUL
// byte) or index (4,000 bytes) count as no identity: parked at once, by
// offset, and the partition moves on.
func TestUnstorableIDsAreParked(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook)
	bad := []kafka.Message{msg("x", 0, 0), msg("x", 0, 1), msg("x", 0, 2)}
	bad[0].Headers[0].Value = []byte{0x8f, 0xa1, 0xc3, 0x28, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc}
	bad[1].Headers[0].Value = []byte("a\x00b")
	bad[2].Headers[0].Value = []byte(strings.Repeat("i", inbox.MaxIDLen+1))
	for _, m := range bad {
		if _, err := in.Process(context.Background(), []kafka.Message{m}, record); !errors.Is(err, inbox.ErrNoID) {
			t.Fatalf("Process of an id of %d bytes: %v, want ErrNoID", len(m.Headers[0].Value), err)
		}
	}
	runSlice(t, in, append(bad, msg("next", 0, 3)), record, func() bool { return parked.Load() == 3 && len(effects(t, pool)) == 1 })
	if got := effects(t, pool); got["next"] != 1 {
		t.Fatalf("effects %v, want next once", got)
	}
}

// ByFunc's empty identity or error is ErrNoID: distinct messages without
// one are parked, never skipped as duplicates of each other.
func TestByFuncWithoutIdentity(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook, inbox.WithIdentity(inbox.ByFunc(func(m kafka.Message) (string, error) {
		switch string(m.Value) {
		case "v-a", "v-b":
			return "", nil // the payload's id field is absent
		case "v-c":
			return "", errors.New("payload is not JSON")
		}
		return string(m.Value), nil
	})))
	msgs := []kafka.Message{msg("a", 0, 0), msg("b", 0, 1), msg("c", 0, 2), msg("d", 0, 3)}
	if _, err := in.Process(context.Background(), msgs[:2], record); !errors.Is(err, inbox.ErrNoID) {
		t.Fatalf("Process with empty identities: %v, want ErrNoID", err)
	}
	runSlice(t, in, msgs, record, func() bool { return parked.Load() == 3 && len(effects(t, pool)) == 1 })
	if got := effects(t, pool); got["d"] != 1 {
		t.Fatalf("effects %v, want d once", got)
	}
}

// A message is parked whatever its headers and its handler's error hold:
// a NUL byte in a header (kept as base64, in order, repeated keys too) or
// an error text that is not UTF-8.
func TestParkStoresAnyHeadersAndError(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook)
	noID := msg("", 0, 0)
	noID.Headers = []kafka.Header{{Key: "trace-bin", Value: []byte{0, 1, 2}}, {Key: "tag", Value: []byte("a")}, {Key: "tag", Value: []byte("b")}}
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "v-bad" {
			return inbox.Permanent(fmt.Errorf("cannot decode payload: %s", []byte{0xff, 0xfe}))
		}
		return record(ctx, tx, m)
	}
	runSlice(t, in, []kafka.Message{noID, msg("bad", 0, 1), msg("next", 0, 2)}, h,
		func() bool { return parked.Load() == 2 && len(effects(t, pool)) == 1 })
	var headers []byte
	if err := pool.QueryRow(context.Background(), `SELECT headers FROM nolock_inbox_parked WHERE "offset" = 0`).Scan(&headers); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(headers, &got); err != nil {
		t.Fatal(err)
	}
	want := `[map[base64:AAEC key:trace-bin] map[key:tag value:a] map[key:tag value:b]]`
	if fmt.Sprint(got) != want {
		t.Fatalf("parked headers %v, want %s", got, want)
	}
}

// A message another member applied while this one's attempt failed is not
// parked too (a replay of the parked queue would apply it twice); a
// message without identity redelivered is parked once, its hook called
// once.
func TestParkOnlyWhatWasNotProcessed(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	b := newInbox(t, pool)
	bDone := make(chan error, 1)
	bFinished := make(chan struct{})
	// a counts its failed attempt (and may park) only once b's transaction
	// ended: b applies x after a's attempt rolled back and before a looks.
	counted := new(atomic.Bool)
	a, err := inbox.New(queryAfter{pool, bFinished, counted}, "billing", inbox.WithAttempts(1), hook)
	if err != nil {
		t.Fatal(err)
	}
	m := msg("x", 0, 0)
	var once sync.Once
	runSlice(t, a, []kafka.Message{m}, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		once.Do(func() {
			go func() {
				_, err := b.Process(context.Background(), []kafka.Message{m}, record)
				close(bFinished)
				bDone <- err
			}()
			testenv.WaitLockWaiters(t, pool, 1) // b waits on a's claim
		})
		return errors.New("downstream timeout")
	}, func() bool {
		// b applied x, and a is done with its failed attempt: counted,
		// then found x processed and dropped its counter.
		return len(effects(t, pool)) == 1 && counted.Load() &&
			count(t, pool, `SELECT count(*) FROM nolock_inbox_attempts`) == 0
	})
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if k := count(t, pool, `SELECT count(*) FROM nolock_inbox_parked`); k != 0 || parked.Load() != 0 {
		t.Fatalf("x applied by b and also parked by a: %d parked rows, %d hook calls", k, parked.Load())
	}
	for pass := 0; pass < 3; pass++ {
		runSlice(t, a, []kafka.Message{msg("", 0, 7)}, record, func() bool { return parked.Load() >= 1 })
	}
	if k := count(t, pool, `SELECT count(*) FROM nolock_inbox_parked`); k != 1 || parked.Load() != 1 {
		t.Fatalf("a message without identity delivered 3 times: %d parked rows, %d hook calls; want 1 and 1", k, parked.Load())
	}
	if k := count(t, pool, `SELECT count(*) FROM nolock_inbox_attempts`); k != 0 {
		t.Fatalf("%d attempt counters left", k)
	}
}

// queryAfter is a DB whose QueryRow, with which an Inbox counts a failed
// attempt, waits until after is closed; counted is set once that count
// has been read (its statement committed).
type queryAfter struct {
	inbox.DB
	after   <-chan struct{}
	counted *atomic.Bool
}

func (q queryAfter) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	<-q.after
	return countedRow{q.DB.QueryRow(ctx, sql, args...), q.counted}
}

type countedRow struct {
	pgx.Row
	counted *atomic.Bool
}

func (r countedRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	r.counted.Store(err == nil)
	return err
}

// A handler whose own query times out (pgx then closes the connection)
// failed on its message: counted, and parked after the attempts.
func TestHandlerTimeoutIsTheMessagesFault(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, inbox.WithAttempts(2), hook)
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "v-slow" {
			qctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(qctx, `SELECT pg_sleep(1)`)
			return err
		}
		return record(ctx, tx, m)
	}
	runSlice(t, in, []kafka.Message{msg("slow", 0, 0), msg("next", 0, 1)}, h,
		func() bool { return parked.Load() == 1 && len(effects(t, pool)) == 1 })
}

// Reap deletes its own consumer's records only: another consumer sharing
// the tables keeps its own, and still skips what it processed.
func TestReapKeepsOtherConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	shipping, err := inbox.New(pool, "shipping")
	if err != nil {
		t.Fatal(err)
	}
	billing := newInbox(t, pool)
	if _, err := shipping.Process(ctx, []kafka.Message{msg("s1", 0, 0)}, record); err != nil {
		t.Fatal(err)
	}
	mustExecInbox(t, pool, `UPDATE nolock_inbox SET processed_at = now() - interval '2 hours'`)
	if n, err := billing.Reap(ctx, time.Hour, 100); err != nil || n != 0 {
		t.Fatalf("billing's Reap: %d, %v; want 0 (the old record is shipping's)", n, err)
	}
	out, err := shipping.Process(ctx, []kafka.Message{msg("s1", 0, 0)}, record)
	if err != nil || out.Duplicates != 1 {
		t.Fatalf("shipping's redelivery: %+v, %v; want a duplicate", out, err)
	}
	if n, err := shipping.Reap(ctx, time.Hour, 100); err != nil || n != 1 {
		t.Fatalf("shipping's Reap: %d, %v; want 1", n, err)
	}
}

func mustExecInbox(t *testing.T, pool interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

// A message that fails twice and then succeeds leaves no attempt counter
// behind (ByWatermark's "no cleanup" holds).
func TestSuccessDropsAttemptCounter(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	in := newInbox(t, pool, inbox.WithIdentity(inbox.ByWatermark()))
	var calls atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "v-flaky" && calls.Add(1) <= 2 {
			return errors.New("downstream blip")
		}
		return record(ctx, tx, m)
	}
	runSlice(t, in, []kafka.Message{msg("flaky", 0, 0), msg("next", 0, 1)}, h, func() bool { return len(effects(t, pool)) == 2 })
	if k := count(t, pool, `SELECT count(*) FROM nolock_inbox_attempts`); k != 0 || calls.Load() < 3 {
		t.Fatalf("%d attempt counters left after %d calls, want 0 after at least 3", k, calls.Load())
	}
}

// A handler that panics on a message does not take the process down: Run
// counts the panic as the message's failure and parks it after the
// attempts, with the panic and its stack as the error.
func TestRunRecoversHandlerPanic(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, inbox.WithAttempts(2), hook, inbox.WithMaxBatch(1)) // one message per attempt: 2 runs
	var boom atomic.Int64
	h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		if string(m.Value) == "v-boom" {
			boom.Add(1)
			panic("payload has no amount") // a bug in the handler
		}
		return record(ctx, tx, m)
	}
	runSlice(t, in, []kafka.Message{msg("boom", 0, 0), msg("next", 0, 1)}, h,
		func() bool { return parked.Load() == 1 && len(effects(t, pool)) == 1 })
	var reason string
	if err := pool.QueryRow(context.Background(), `SELECT error FROM nolock_inbox_parked`).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if boom.Load() != 2 || !strings.Contains(reason, "handler panicked: payload has no amount") || !strings.Contains(reason, "TestRunRecoversHandlerPanic") {
		t.Fatalf("handler ran %d times; parked error %q; want 2 runs and the panic with its stack", boom.Load(), reason)
	}
}

// A message whose handler loses its connection every time (it ends its
// own backend) is, in the end, the message's trouble: after more losses
// than the attempts allowed, they count, and the message is parked, through
// PgBouncer (pgx's exec mode) as directly.
func TestRunConnectionLostEveryTimeIsParked(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dep   string
		batch int // alone, and inside a batch
	}{{"direct", 1}, {"direct", 8}, {"pgbouncer", 1}, {"pgbouncer", 8}} {
		t.Run(fmt.Sprintf("%s/batch=%d", c.dep, c.batch), func(t *testing.T) {
			t.Parallel()
			batch := c.batch
			pool := testenv.PostgresVia(t, c.dep, 4)
			parked, hook := parkCounter()
			in := newInbox(t, pool, inbox.WithAttempts(2), hook, inbox.WithMaxBatch(batch), inbox.WithBatchWait(testenv.Scale(100*time.Millisecond)))
			h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
				if string(m.Value) == "v-bad" {
					_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
					return err
				}
				return record(ctx, tx, m)
			}
			runUntil(t, in, &sliceReader{msgs: []kafka.Message{msg("bad", 0, 0), msg("next", 0, 1)}}, h,
				func() bool { return parked.Load() == 1 && len(effects(t, pool)) == 1 })
		})
	}
}
