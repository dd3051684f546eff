package idempotency_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// Fault: the backend is terminated (pg_terminate_backend) while COMMIT
// runs, here held in a deferred trigger. The caller cannot know the outcome:
// ErrAmbiguousCommit. The commit did not happen, and a retry with the same
// key runs the payment exactly once.
func TestKilledDuringCommitConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	mustExec(t, b.pool, `CREATE TABLE fault (armed boolean NOT NULL)`)
	mustExec(t, b.pool, `INSERT INTO fault VALUES (true)`)
	mustExec(t, b.pool, `CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT armed FROM fault) THEN PERFORM pg_sleep(60); END IF;
  RETURN NULL;
END $$`)
	mustExec(t, b.pool, `CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ledger
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)

	done := make(chan error, 1)
	go func() {
		_, err := b.payOnce(ctx, "pay-1", 500)
		done <- err
	}()
	killed := false
	for i := 0; i < 500 && !killed; i++ {
		time.Sleep(10 * time.Millisecond)
		err := b.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) > 0 FROM pg_stat_activity
WHERE application_name = $1 AND wait_event = 'PgSleep' AND query ILIKE 'commit%'`, b.schema).Scan(&killed)
		if err != nil {
			t.Fatal(err)
		}
	}
	if !killed {
		t.Fatal("COMMIT never reached the deferred trigger")
	}
	err := <-done
	if !errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Do whose backend died in COMMIT: %v, want ErrAmbiguousCommit", err)
	}
	mustExec(t, b.pool, `UPDATE fault SET armed = false`)
	b.check(0, initial) // the kill came before the commit record

	res, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || res.Replayed {
		t.Fatalf("retry: %+v, %v; want a fresh run", res, err)
	}
	res, err = b.payOnce(ctx, "pay-1", 500)
	if err != nil || !res.Replayed {
		t.Fatalf("second retry: %+v, %v; want a replay", res, err)
	}
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("fn ran %d times, want 2 (the killed one and the retry)", n)
	}
	b.check(1, initial-500)
}

// Fault: COMMIT succeeds but its reply never reaches the client (the
// connection drops right after). The caller gets ErrAmbiguousCommit; the
// effect is there, and a retry with the same key replays it rather than
// paying twice.
func TestLostCommitReplyConvergesToOneEffect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	p := newCommitDropper(t, b.schema)
	store, err := idempotency.New(testenv.Pool(t, p.dsn, 2))
	if err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	_, err = store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", 500), b.pay("alice", "pay-1", 500))
	if !errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Do whose COMMIT reply was lost: %v, want ErrAmbiguousCommit", err)
	}
	if p.dropped.Load() != 1 {
		t.Fatalf("the proxy dropped %d COMMIT replies, want 1", p.dropped.Load())
	}
	b.check(1, initial-500) // committed

	res, err := b.payOnce(ctx, "pay-1", 500)
	if err != nil || !res.Replayed || string(res.Body) != "paid pay-1 500" {
		t.Fatalf("retry: %+v, %v; want a replay", res, err)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("fn ran %d times, want 1", n)
	}
	b.check(1, initial-500)
}

// commitDropper is a TCP proxy in front of the test's PostgreSQL. Once
// armed, it swallows the first reply that reports a committed transaction
// (CommandComplete "COMMIT") and closes that connection: the server has
// committed, the client never hears it.
type commitDropper struct {
	dsn     string
	armed   atomic.Bool
	dropped atomic.Int64
}

func newCommitDropper(t *testing.T, schema string) *commitDropper {
	t.Helper()
	p := &commitDropper{}
	p.dsn = testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), nil, p.relay)
	return p
}

// relay copies the server's messages (a type byte, a 4-byte length that
// counts itself, the body) to the client, except the armed drop.
func (p *commitDropper) relay(client io.Writer, server io.Reader) {
	var head [5]byte
	for {
		if _, err := io.ReadFull(server, head[:]); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(head[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		if head[0] == 'C' && bytes.Equal(body, []byte("COMMIT\x00")) && p.armed.CompareAndSwap(true, false) {
			p.dropped.Add(1)
			return
		}
		if _, err := client.Write(append(head[:], body...)); err != nil {
			return
		}
	}
}
