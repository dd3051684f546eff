package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/parkedhttp"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// Bad IDs and flags are usage errors, found before anything connects: the
// DSN and URL given point nowhere, so a connection would exit 1.
func TestParkedUsageErrors(t *testing.T) {
	const pg = "host=unreachable.invalid connect_timeout=1"
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"list"}, // neither -inbox nor -group
		{"list", "-inbox", "a", "-group", "b", "-postgres", pg},
		{"list", "-inbox", "a", "-postgres", pg, "t/0@1"},
		{"list", "-inbox", "a", "-postgres", pg, "-partition", "-2"},
		{"list", "-inbox", "a", "-postgres", pg, "-older-than", "1h"},
		{"list", "-service", "ftp://x/", "-inbox", "a"},
		{"list", "-service", "not a url"},
		{"replay", "-inbox", "a", "-postgres", pg, "t/0@1"}, // replay needs -service
		{"replay", "-service", "http://unreachable.invalid/"},
		{"replay", "-service", "http://unreachable.invalid/", "t/0"},
		{"replay", "-service", "http://unreachable.invalid/", "t/-1@0"},
		{"replay", "-service", "http://unreachable.invalid/", "t/01@0"},
		{"replay", "-service", "http://unreachable.invalid/", "t/0@1", "t/0@2"},
		{"purge", "-inbox", "a", "-postgres", pg},
		{"purge", "-inbox", "a", "-postgres", pg, "-older-than", "1h", "t/0@1"},
		{"purge", "-inbox", "a", "-postgres", pg, "-older-than", "-1h"},
		{"purge", "-inbox", "a", "-postgres", pg, "-topic", "t", "t/0@1"},
		{"purge", "-group", "g", "-postgres", pg, "@1"},
		{"list", "-inbox", "a", "-postgres", pg, "-timeout", "0s"},
		{"list", "-bogus"},
	} {
		code, stdout, stderr := runArgs(t, append([]string{"parked"}, args...)...)
		if code != 2 || stdout != "" || stderr == "" {
			t.Errorf("parked %q: exit %d, stdout %q, stderr %q; want exit 2 and the complaint on stderr", args, code, stdout, stderr)
		}
	}
}

// parkedBed is a consumer whose messages were parked as Run parks them,
// its handler for replays and the effects that handler applied.
type parkedBed struct {
	dsn     string
	schema  string
	pool    *pgxpool.Pool
	sel     []string // the CLI's -inbox or -group
	serve   http.Handler
	served  func(pool *pgxpool.Pool) http.Handler // the service's handler on pool
	ids     []string                              // parked, in list order
	applied func() int
}

// The operator's commands on real parked messages, for inbox and
// partition (and inbox through PgBouncer in pgx's default mode): list
// pages through all of them (-json parses, filters keep
// some), replay through the service applies one once and a second replay
// is "not parked", purge one and purge by age delete.
func TestParkedCommands(t *testing.T) {
	for _, kind := range []struct {
		name  string
		setup func(t *testing.T) parkedBed
	}{
		{"inbox", inboxBed}, {"partition", partitionBed},
		{"inbox behind PgBouncer", behindPgBouncer(inboxBed)}, {"partition behind PgBouncer", behindPgBouncer(partitionBed)},
	} {
		t.Run(kind.name, func(t *testing.T) {
			b := kind.setup(t)
			db := append([]string{"-postgres", b.dsn}, b.sel...)
			list := func(args ...string) []parkedhttp.Message {
				t.Helper()
				code, stdout, stderr := runArgs(t, append([]string{"parked", "list", "-json"}, args...)...)
				var ms []parkedhttp.Message
				if err := json.Unmarshal([]byte(stdout), &ms); code != 0 || err != nil {
					t.Fatalf("list %q: exit %d, %v:\n%s%s", args, code, err, stdout, stderr)
				}
				return ms
			}
			ms := list(db...)
			if len(ms) != len(b.ids) {
				t.Fatalf("listed %d, want %d: %+v", len(ms), len(b.ids), ms)
			}
			for i, m := range ms {
				if m.ID != b.ids[i] || m.Attempts != 1 || !strings.Contains(m.Error, "not a number") || m.Value == "" || m.ValueSize != len(m.Value) || m.ParkedAt.IsZero() {
					t.Errorf("listed %d: %+v; want %s, 1 attempt, the handler's error, its value", i, m, b.ids[i])
				}
			}
			if n := len(list(append(db, "-partition", "1")...)); n != 1 {
				t.Errorf("-partition 1 listed %d, want 1", n)
			}
			if n := len(list(append(db, "-topic", "other")...)); n != 0 {
				t.Errorf("-topic other listed %d, want 0", n)
			}
			code, stdout, _ := runArgs(t, append([]string{"parked", "list"}, db...)...)
			if code != 0 || !strings.Contains(stdout, b.ids[0]) || !strings.Contains(stdout, "3 parked") {
				t.Errorf("list as text: exit %d:\n%s", code, stdout)
			}

			srv := httptest.NewServer(http.StripPrefix("/admin/parked", b.serve))
			defer srv.Close()
			svc := []string{"-service", srv.URL + "/admin/parked/"}
			if n := len(list(svc...)); n != 3 {
				t.Errorf("list through the service: %d, want 3", n)
			}
			code, stdout, stderr := runArgs(t, append(append([]string{"parked", "replay", "-json"}, svc...), b.ids[0])...)
			var r parkedhttp.Replayed
			if err := json.Unmarshal([]byte(stdout), &r); code != 0 || err != nil || r.Replayed != b.ids[0] {
				t.Fatalf("replay: exit %d, %v: %s%s", code, err, stdout, stderr)
			}
			code, _, stderr = runArgs(t, append(append([]string{"parked", "replay"}, svc...), b.ids[0])...)
			if code != 1 || !strings.Contains(stderr, "not parked") {
				t.Errorf("second replay: exit %d, stderr %q; want 1, not parked", code, stderr)
			}
			code, _, stderr = runArgs(t, append(append([]string{"parked", "replay"}, svc...), b.ids[2])...)
			if code != 1 || !strings.Contains(stderr, errStillBad.Error()) || !strings.Contains(stderr, "handler_failed") {
				t.Errorf("replay whose handler fails: exit %d, stderr %q; want 1, the handler's error", code, stderr)
			}
			if n := b.applied(); n != 1 {
				t.Errorf("replays applied %d effects, want 1", n)
			}
			for _, m := range list(append(db, "-partition", "2")...) {
				if m.ID != b.ids[2] || m.Attempts != 2 || !strings.Contains(m.Error, errStillBad.Error()) {
					t.Errorf("after a failed replay: %+v; want still parked, 2 attempts, its error", m)
				}
			}

			code, stdout, stderr = runArgs(t, append(append([]string{"parked", "purge"}, db...), b.ids[1])...)
			if code != 0 || strings.TrimSpace(stdout) != "purged 1" {
				t.Errorf("purge: exit %d: %s%s", code, stdout, stderr)
			}
			if code, _, stderr = runArgs(t, append(append([]string{"parked", "purge"}, svc...), b.ids[1])...); code != 1 || !strings.Contains(stderr, "not parked") {
				t.Errorf("second purge: exit %d, stderr %q; want 1, not parked", code, stderr)
			}
			purged := func(args ...string) int64 {
				t.Helper()
				code, stdout, stderr := runArgs(t, append([]string{"parked", "purge", "-json"}, args...)...)
				var p parkedhttp.Purged
				if err := json.Unmarshal([]byte(stdout), &p); code != 0 || err != nil {
					t.Fatalf("purge %q: exit %d, %v: %s%s", args, code, err, stdout, stderr)
				}
				return p.Purged
			}
			if n := purged(append(db, "-older-than", "1h")...); n != 0 {
				t.Errorf("purge -older-than 1h purged %d, want 0", n)
			}
			left := list(db...)
			if len(left) != 1 || left[0].ID != b.ids[2] {
				t.Fatalf("left after replay and purge: %+v, want %s", left, b.ids[2])
			}
			if n := purged(append(svc, "-older-than", "1µs")...); n != 1 {
				t.Errorf("purge -older-than 1µs purged %d, want 1", n)
			}
			if n := len(list(db...)); n != 0 {
				t.Errorf("%d left after purging all, want 0", n)
			}
		})
	}
}

// behindPgBouncer is setup's bed with the command and the service going
// through PgBouncer in transaction pooling, in pgx's default mode: each
// command, and the service's handler, starts with no named statement
// learnt.
func behindPgBouncer(setup func(t *testing.T) parkedBed) func(t *testing.T) parkedBed {
	return func(t *testing.T) parkedBed {
		b := setup(t)
		b.dsn = testenv.PgBouncerDSNFor(t, b.schema)
		b.serve = b.served(testenv.Pool(t, b.dsn, 4))
		return b
	}
}

// effectsTable makes the table replays write to and returns its count.
func effectsTable(t *testing.T, pool *pgxpool.Pool) func() int {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (v text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return func() int {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM effects`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
}

// apply is the service's handler for replays: it writes an effect, and
// still refuses the message of partition 2 (after writing).
func apply(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
	if _, err := tx.Exec(ctx, `INSERT INTO effects (v) VALUES ($1)`, string(m.Value)); err != nil {
		return err
	}
	if string(m.Value) == "amount=x2" {
		return errStillBad
	}
	return nil
}

var errStillBad = errors.New("amount is still not a number")

var errPoison = inbox.Permanent(errNotNumber{})

type errNotNumber struct{}

func (errNotNumber) Error() string { return "amount is not a number" }

// inboxBed parks three messages, partitions 0, 1 and 2, through Run.
func inboxBed(t *testing.T) parkedBed {
	pool, schema := testenv.PostgresSchema(t, 4)
	consumer := testenv.Name("c")
	in, err := inbox.New(pool, consumer)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	for p := range 3 {
		msgs = append(msgs, kafka.Message{Topic: "payments", Partition: p, Offset: 7, Value: []byte("amount=x" + string(rune('0'+p))),
			Headers: []kafka.Header{{Key: "id", Value: []byte{'m', byte('0' + p)}}}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- in.Run(ctx, &queueReader{msgs: msgs}, func(context.Context, pgx.Tx, kafka.Message) error { return errPoison })
	}()
	testenv.Until(t, "3 parked", func() (bool, error) {
		ps, err := in.ListParked(context.Background(), inbox.ParkedID{}, 10)
		return len(ps) == 3, err
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return parkedBed{
		dsn: testenv.PostgresDSNFor(t, schema), schema: schema, pool: pool, sel: []string{"-inbox", consumer},
		serve: inbox.ParkedHandler(in, apply), served: func(pool *pgxpool.Pool) http.Handler {
			in, err := inbox.New(pool, consumer)
			if err != nil {
				t.Fatal(err)
			}
			return inbox.ParkedHandler(in, apply)
		}, ids: []string{"payments/0@7", "payments/1@7", "payments/2@7"},
		applied: effectsTable(t, pool),
	}
}

// queueReader hands out msgs, then waits for ctx.
type queueReader struct {
	mu   sync.Mutex
	msgs []kafka.Message
}

func (r *queueReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	r.mu.Lock()
	if len(r.msgs) > 0 {
		m := r.msgs[0]
		r.msgs = r.msgs[1:]
		r.mu.Unlock()
		return m, nil
	}
	r.mu.Unlock()
	<-ctx.Done()
	return kafka.Message{}, ctx.Err()
}

func (r *queueReader) CommitMessages(context.Context, ...kafka.Message) error { return nil }

// partitionBed produces one message to each of three partitions and parks
// them through a Consumer's Run.
func partitionBed(t *testing.T) parkedBed {
	pool, schema := testenv.PostgresSchema(t, 8)
	brokers, topic := testenv.Topic(t, 3)
	group := testenv.Name("g")
	c, err := partition.New(pool, brokers, group, []string{topic})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(context.Background()); err != nil {
		t.Fatal(err)
	}
	tr := &kafka.Transport{} // its own metadata: the shared one may not know the new topic yet
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') })}
	defer w.Close()
	var msgs []kafka.Message
	for p := range 3 {
		msgs = append(msgs, kafka.Message{Key: []byte{byte('0' + p)}, Value: []byte("amount=x" + string(rune('0'+p)))})
	}
	wctx, wcancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer wcancel()
	if err := w.WriteMessages(wctx, msgs...); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(context.Context, pgx.Tx, []kafka.Message) error { return partition.Permanent(errNotNumber{}) })
	}()
	testenv.Until(t, "3 parked", func() (bool, error) {
		ps, err := c.ListParked(context.Background(), partition.ParkedID{}, 10)
		return len(ps) == 3, err
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	replay := func(ctx context.Context, tx pgx.Tx, ms []kafka.Message) error {
		for _, m := range ms {
			if err := apply(ctx, tx, m); err != nil {
				return err
			}
		}
		return nil
	}
	return parkedBed{
		dsn: testenv.PostgresDSNFor(t, schema), schema: schema, pool: pool, sel: []string{"-group", group},
		serve: partition.ParkedHandler(c, replay), served: func(pool *pgxpool.Pool) http.Handler {
			c, err := partition.New(pool, brokers, group, []string{topic})
			if err != nil {
				t.Fatal(err)
			}
			return partition.ParkedHandler(c, replay)
		}, ids: []string{topic + "/0@0", topic + "/1@0", topic + "/2@0"},
		applied: effectsTable(t, pool),
	}
}
