package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// An Inbox on a *pgx.Conn processes as on a pool: new messages applied
// once, duplicates skipped; Run works on 3 partitions' 60 messages one
// batch at a time through the connection, each applied once.
func TestInboxOnAConn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 0)
	newInbox(t, pool) // the tables
	conn := testenv.PostgresConn(t, schema)
	in, err := inbox.New(conn, "billing", inbox.WithMaxBatch(4))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1)}, record); err != nil || out.Processed != 2 {
		t.Fatalf("Process on a conn: %+v, %v; want 2 processed", out, err)
	}
	if out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("c", 0, 2)}, record); err != nil || out.Processed != 1 || out.Duplicates != 1 {
		t.Fatalf("Process again on a conn: %+v, %v; want 1 processed, 1 duplicate", out, err)
	}
	var msgs []kafka.Message
	for i := 0; i < 60; i++ {
		msgs = append(msgs, msg(fmt.Sprint("r-", i), i%3, int64(i/3)+10))
	}
	runSlice(t, in, msgs, record, func() bool { return len(effects(t, pool)) == 63 })
	for id, n := range effects(t, pool) {
		if n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
}

// An Inbox on the caller's pgx.Tx applies and records in it: a rollback
// leaves neither effect nor record (the message is new again), a commit
// keeps both. Run refuses such an Inbox with ErrInvalid before fetching.
func TestInboxInACallersTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	newInbox(t, pool) // the tables
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		in, err := inbox.New(tx, "billing")
		if err != nil {
			t.Fatal(err)
		}
		if out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0), msg("b", 0, 1)}, record); err != nil || out.Processed != 2 {
			t.Fatalf("Process in a tx: %+v, %v; want 2 processed", out, err)
		}
		if out, err := in.Process(ctx, []kafka.Message{msg("a", 0, 0)}, record); err != nil || out.Duplicates != 1 {
			t.Fatalf("Process again in the same tx: %+v, %v; want a duplicate", out, err)
		}
		err = in.Run(ctx, unfetched{t}, record)
		if !errors.Is(err, inbox.ErrInvalid) || !strings.Contains(err.Error(), "pgx.Tx") {
			t.Fatalf("Run on an Inbox on a tx: %v; want ErrInvalid naming the pgx.Tx", err)
		}
		if err := in.Close(); err != nil {
			t.Fatal(err)
		}
		if got := len(effects(t, pool)); got != 0 {
			t.Fatalf("%d effects visible through the pool while the tx is open, want 0", got)
		}
		end, want := tx.Rollback, 0
		if commit {
			end, want = tx.Commit, 2
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
		if got, records := len(effects(t, pool)), count(t, pool, `SELECT count(*) FROM nolock_inbox`); got != want || records != want {
			t.Fatalf("commit=%v: %d effects, %d records; want %d each", commit, got, records, want)
		}
	}
}

// unfetched is a Reader that fails the test if Run uses it.
type unfetched struct{ t *testing.T }

func (u unfetched) FetchMessage(context.Context) (kafka.Message, error) {
	u.t.Error("Run fetched")
	return kafka.Message{}, errors.New("unfetched")
}

func (u unfetched) CommitMessages(context.Context, ...kafka.Message) error {
	u.t.Error("Run committed offsets")
	return nil
}
