package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// errPoison is the handler's error on the messages parkAll parks.
var errPoison = errors.New("amount is not a number")

// parkAll parks msgs through Run: its handler refuses each one as
// Permanent, so each is parked on its first attempt.
func parkAll(t *testing.T, in *inbox.Inbox, parked interface{ Load() int64 }, msgs ...kafka.Message) {
	t.Helper()
	want := parked.Load() + int64(len(msgs))
	runSlice(t, in, msgs, func(context.Context, pgx.Tx, kafka.Message) error {
		return inbox.Permanent(errPoison)
	}, func() bool { return parked.Load() == want })
}

// listAll pages through ListParked two at a time.
func listAll(t *testing.T, in *inbox.Inbox) []inbox.Parked {
	t.Helper()
	var all []inbox.Parked
	var after inbox.ParkedID
	for {
		page, err := in.ListParked(context.Background(), after, 2)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 2 {
			return all
		}
		after = page[len(page)-1].ID
	}
}

// ListParked shows each parked message as it came: id, position, key,
// value, headers in order (a binary value as it was), the error, the
// attempts and when it was parked; paging visits each once.
func TestListParkedShowsWhatWasParked(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook)
	var msgs []kafka.Message
	for i, id := range []string{"p-1", "p-2", "p-3"} {
		m := msg(id, 2, int64(10+i))
		m.Key = []byte("acct-" + id)
		m.Headers = append(m.Headers, kafka.Header{Key: "bin", Value: []byte{0, 0xff}}, kafka.Header{Key: "tag", Value: []byte("x")})
		msgs = append(msgs, m)
	}
	before := time.Now()
	parkAll(t, in, parked, msgs...)
	got := listAll(t, in)
	if len(got) != len(msgs) {
		t.Fatalf("listed %d parked messages, want %d: %+v", len(got), len(msgs), got)
	}
	for i, p := range got {
		m := msgs[i]
		id := inbox.ParkedID{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset}
		if p.ID != id || p.MessageID != string(m.Headers[0].Value) || p.Msg.Topic != m.Topic || p.Msg.Partition != m.Partition || p.Msg.Offset != m.Offset ||
			string(p.Msg.Key) != string(m.Key) || string(p.Msg.Value) != string(m.Value) {
			t.Errorf("parked %d: %s %s/%d@%d key %q value %q; want %+v", i, p.ID, p.Msg.Topic, p.Msg.Partition, p.Msg.Offset, p.Msg.Key, p.Msg.Value, m)
		}
		if len(p.Msg.Headers) != 3 || p.Msg.Headers[1].Key != "bin" || string(p.Msg.Headers[1].Value) != "\x00\xff" || string(p.Msg.Headers[2].Value) != "x" {
			t.Errorf("parked %d: headers %q, want id, bin and tag as sent", i, p.Msg.Headers)
		}
		if !strings.Contains(p.Error, errPoison.Error()) || p.Attempts != 1 || p.ParkedAt.Before(before.Add(-time.Minute)) {
			t.Errorf("parked %d: error %q, attempts %d, parked at %v; want the handler's error, 1, now", i, p.Error, p.Attempts, p.ParkedAt)
		}
	}
	// Another consumer sharing the tables sees none of them.
	other, err := inbox.New(pool, "audit")
	if err != nil {
		t.Fatal(err)
	}
	if page, err := other.ListParked(context.Background(), inbox.ParkedID{}, 10); err != nil || len(page) != 0 {
		t.Fatalf("another consumer lists %d parked messages (%v), want 0", len(page), err)
	}
}

// A replay that fails again leaves the message parked, says why, and
// counts the attempt; once the handler is fixed the replay applies it
// once, records it as processed (a redelivery is a duplicate), and a
// second replay finds nothing.
func TestReplayParkedAfterFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		identity inbox.Identity
	}{
		{"by header", inbox.ByHeader("id")},
		{"by watermark", inbox.ByWatermark()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.Postgres(t)
			parked, hook := parkCounter()
			in := newInbox(t, pool, hook, inbox.WithIdentity(tc.identity))
			m := msg("pay-7", 0, 7)
			parkAll(t, in, parked, m)
			id := inbox.ParkedID{Topic: m.Topic, Partition: 0, Offset: 7}

			stillBroken := errors.New("still not a number")
			err := in.ReplayParked(ctx, id, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
				if err := record(ctx, tx, m); err != nil {
					return err
				}
				return stillBroken // after a write: it must roll back
			})
			var he *inbox.HandlerError
			if !errors.Is(err, stillBroken) || !errors.As(err, &he) || he.Msg.Offset != 7 {
				t.Fatalf("failing replay: %v; want a *HandlerError with the handler's error", err)
			}
			got := listAll(t, in)
			if len(got) != 1 || got[0].Attempts != 2 || !strings.Contains(got[0].Error, stillBroken.Error()) || len(effects(t, pool)) != 0 {
				t.Fatalf("after a failing replay: parked %+v, effects %v; want still parked, 2 attempts, the new error, no effect", got, effects(t, pool))
			}

			if err := in.ReplayParked(ctx, id, record); err != nil {
				t.Fatalf("replay after the fix: %v", err)
			}
			if got := effects(t, pool); len(got) != 1 || got["pay-7"] != 1 {
				t.Fatalf("effects %v after the replay, want pay-7 once", got)
			}
			if got := listAll(t, in); len(got) != 0 {
				t.Fatalf("still parked after the replay: %+v", got)
			}
			if err := in.ReplayParked(ctx, id, record); !errors.Is(err, inbox.ErrNotParked) {
				t.Fatalf("second replay: %v, want ErrNotParked", err)
			}
			if out, err := in.Process(ctx, []kafka.Message{m}, record); err != nil || out.Duplicates != 1 {
				t.Fatalf("redelivery after the replay: %+v, %v; want a duplicate", out, err)
			}
			if got := effects(t, pool); got["pay-7"] != 1 {
				t.Fatalf("effects %v, want pay-7 once", got)
			}
		})
	}
}

// Two replays of one parked message at once apply it once: the second
// waits on the first's transaction and, if that commits, finds nothing
// (ErrNotParked); if the first fails, the second applies it.
func TestConcurrentReplaysApplyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		firstFail bool
	}{
		{"first commits", false},
		{"first fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testenv.Postgres(t)
			parked, hook := parkCounter()
			in := newInbox(t, pool, hook)
			parkAll(t, in, parked, msg("x", 0, 0))
			x := inbox.ParkedID{Topic: msg("x", 0, 0).Topic, Partition: 0, Offset: 0}

			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			first := make(chan error, 1)
			go func() {
				first <- in.ReplayParked(ctx, x, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
					once.Do(func() { close(entered) })
					<-release
					if err := record(ctx, tx, m); err != nil {
						return err
					}
					if tc.firstFail {
						return errors.New("downstream refused")
					}
					return nil
				})
			}()
			<-entered
			second := make(chan error, 1)
			go func() { second <- in.ReplayParked(ctx, x, record) }()
			testenv.WaitLockWaiters(t, pool, 1) // the second waits on the first's row lock
			close(release)
			err1, err2 := <-first, <-second

			if tc.firstFail {
				if err1 == nil || err2 != nil {
					t.Fatalf("first %v, second %v; want the first's handler error, the second applied", err1, err2)
				}
			} else if err1 != nil || !errors.Is(err2, inbox.ErrNotParked) {
				t.Fatalf("first %v, second %v; want nil and ErrNotParked", err1, err2)
			}
			if got := effects(t, pool); len(got) != 1 || got["x"] != 1 {
				t.Fatalf("effects %v, want x exactly once", got)
			}
			if n := count(t, pool, `SELECT count(*) FROM nolock_inbox_parked`); n != 0 {
				t.Fatalf("%d parked rows left, want 0", n)
			}
		})
	}
}

// PurgeParked deletes the one named, no other; PurgeParkedOlderThan
// deletes this consumer's rows parked before the retention, no newer one
// and no other consumer's.
func TestPurgeParked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	parked, hook := parkCounter()
	in := newInbox(t, pool, hook)
	otherParked, otherHook := parkCounter()
	other, err := inbox.New(pool, "audit", otherHook)
	if err != nil {
		t.Fatal(err)
	}
	parkAll(t, in, parked, msg("a", 0, 0), msg("b", 0, 1), msg("c", 0, 2), msg("d", 0, 3))
	parkAll(t, other, otherParked, msg("a", 0, 0))

	b := inbox.ParkedID{Topic: msg("b", 0, 1).Topic, Partition: 0, Offset: 1}
	if err := in.PurgeParked(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := in.PurgeParked(ctx, b); !errors.Is(err, inbox.ErrNotParked) {
		t.Fatalf("purging b again: %v, want ErrNotParked", err)
	}
	if ids := parkedIDs(t, in); ids != "a c d" {
		t.Fatalf("parked after purging b: %s, want a c d", ids)
	}

	if _, err := pool.Exec(ctx, `UPDATE nolock_inbox_parked SET parked_at = now() - interval '8 days' WHERE message_id IN ('a', 'c')`); err != nil {
		t.Fatal(err)
	}
	n, err := in.PurgeParkedOlderThan(ctx, 7*24*time.Hour, 1)
	if err != nil || n != 2 {
		t.Fatalf("purged %d parked over 7 days ago (%v), want 2: a and c", n, err)
	}
	if ids := parkedIDs(t, in); ids != "d" {
		t.Fatalf("parked after the retention purge: %s, want d", ids)
	}
	if ids := parkedIDs(t, other); ids != "a" {
		t.Fatalf("the other consumer's parked after our purges: %s, want its a, as old as ours", ids)
	}
}

func parkedIDs(t *testing.T, in *inbox.Inbox) string {
	t.Helper()
	var ids []string
	for _, p := range listAll(t, in) {
		ids = append(ids, p.MessageID)
	}
	return strings.Join(ids, " ")
}

// noIO is a DB that fails the test if it is used.
type noIO struct{ t *testing.T }

func (d noIO) Begin(context.Context) (pgx.Tx, error) {
	d.t.Error("Begin called")
	return nil, errors.New("no I/O")
}

func (d noIO) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	d.t.Error("Exec called")
	return pgconn.CommandTag{}, errors.New("no I/O")
}

func (d noIO) QueryRow(context.Context, string, ...any) pgx.Row {
	d.t.Error("QueryRow called")
	return nil
}

var _ inbox.DB = noIO{}

// Bad input to the parked calls is ErrInvalid, before any I/O.
func TestParkedBadInput(t *testing.T) {
	t.Parallel()
	in, err := inbox.New(noIO{t}, "billing")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var nilCtx context.Context
	x := inbox.ParkedID{Topic: "t"}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"list: nil ctx", func() error { _, err := in.ListParked(nilCtx, inbox.ParkedID{}, 1); return err }()},
		{"list: limit 0", func() error { _, err := in.ListParked(ctx, inbox.ParkedID{}, 0); return err }()},
		{"list: after not UTF-8", func() error { _, err := in.ListParked(ctx, inbox.ParkedID{Topic: "\xff"}, 1); return err }()},
		{"list: after a negative offset", func() error { _, err := in.ListParked(ctx, inbox.ParkedID{Topic: "t", Offset: -1}, 1); return err }()},
		{"replay: nil ctx", in.ReplayParked(nilCtx, x, record)},
		{"replay: empty id", in.ReplayParked(ctx, inbox.ParkedID{}, record)},
		{"replay: topic with NUL", in.ReplayParked(ctx, inbox.ParkedID{Topic: "a\x00b"}, record)},
		{"replay: negative partition", in.ReplayParked(ctx, inbox.ParkedID{Topic: "t", Partition: -1}, record)},
		{"replay: nil handler", in.ReplayParked(ctx, x, nil)},
		{"purge: nil ctx", in.PurgeParked(nilCtx, x)},
		{"purge: empty id", in.PurgeParked(ctx, inbox.ParkedID{})},
		{"purge: negative offset", in.PurgeParked(ctx, inbox.ParkedID{Topic: "t", Offset: -1})},
		{"parse: no offset", func() error { _, err := inbox.ParseParkedID("t/1"); return err }()},
		{"purge older: nil ctx", func() error { _, err := in.PurgeParkedOlderThan(nilCtx, time.Hour, 1000); return err }()},
		{"purge older: zero retention", func() error { _, err := in.PurgeParkedOlderThan(ctx, 0, 1000); return err }()},
		{"purge older: zero batch", func() error { _, err := in.PurgeParkedOlderThan(ctx, time.Hour, 0); return err }()},
		{"purge older: negative retention", func() error { _, err := in.PurgeParkedOlderThan(ctx, -time.Hour, 1000); return err }()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, inbox.ErrInvalid) {
				t.Errorf("%v, want ErrInvalid", tc.err)
			}
		})
	}
}

// ParseParkedID reads back what ParkedID.String writes, the Key of
// EventParked.
func TestParseParkedID(t *testing.T) {
	id := inbox.ParkedID{Topic: "orders.v2", Partition: 3, Offset: 1 << 40}
	got, err := inbox.ParseParkedID(id.String())
	if err != nil || got != id || id.String() != "orders.v2/3@1099511627776" {
		t.Fatalf("ParseParkedID(%q) = %v, %v; want %v", id.String(), got, err, id)
	}
}
