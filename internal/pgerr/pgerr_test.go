package pgerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// refusedConn is a connection error from a real dial: port 1 on loopback
// refuses.
func refusedConn(t *testing.T) error {
	t.Helper()
	_, err := pgconn.Connect(context.Background(), "postgres://u@127.0.0.1:1/db?connect_timeout=5")
	var connErr *pgconn.ConnectError
	if !errors.As(err, &connErr) {
		t.Fatalf("dial to port 1: %v; want a *pgconn.ConnectError", err)
	}
	return err
}

func TestOf(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		err  error
		want Outcome
	}{
		{"nil", nil, Committed},
		{"connection lost mid-statement", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), Unknown},
		{"eof", io.EOF, Unknown},
		{"cancelled after sending (pgconn returns a bare Canceled)", context.Canceled, Unknown},
		{"server ERROR", &pgconn.PgError{Severity: "ERROR", Code: "23505"}, Refused},
		{"statement cancelled and rolled back", &pgconn.PgError{Severity: "ERROR", Code: "57014"}, Refused},
		{"serialization failure", &pgconn.PgError{Severity: "ERROR", Code: "40001"}, Refused},
		{"backend terminated (FATAL)", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}, Unknown},
		{"PgBouncer: server conn crashed?", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "server conn crashed?"}, Unknown},
		{"connection class, any severity", &pgconn.PgError{Severity: "ERROR", Code: "08006"}, Unknown},
		{"commit of a failed transaction", pgx.ErrTxCommitRollback, Refused},
		{"encode failed before sending", errors.New("failed to encode args[1]: too big"), Refused},
		{"pool acquire timed out (bare deadline)", context.DeadlineExceeded, NotSent},
		{"marked unsent", MarkUnsent(context.Canceled), NotSent},
		{"context done before the call", ctxDoneBeforeCall(t, ctx), NotSent},
		{"connection closed (pgx's lost COMMIT reply)", fmt.Errorf("commit: %w", pgconn.ErrConnClosed), Unknown},
		{"stopped waiting", errors.Join(ErrStoppedWaiting, context.DeadlineExceeded), Unknown},
		{"refused dial", refusedConn(t), NotSent},
		{"refused dial, wrapped", fmt.Errorf("acquire: %w", refusedConn(t)), NotSent},
	} {
		if got := Of(tc.err); got != tc.want {
			t.Errorf("%s (%v): %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if !Conflict(&pgconn.PgError{Code: "40001"}) || !Conflict(fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40P01"})) || Conflict(&pgconn.PgError{Code: "23505"}) {
		t.Error("Conflict must be true for 40001 and 40P01 only")
	}
}

// ctxDoneBeforeCall is what pgconn returns for a call whose context had
// already ended: a pgx error marked safe to retry, made by a real call.
func ctxDoneBeforeCall(t *testing.T, done context.Context) error {
	t.Helper()
	conn := &pgconn.PgConn{}
	defer func() { _ = recover() }() // an uninitialised conn may panic before checking ctx
	_, err := conn.ReceiveMessage(done)
	if err == nil {
		t.Fatal("no error from a done context")
	}
	return err
}

// Commit returns the commit's own outcome when it ends first; when the
// caller's context ends first it returns at once with an Unknown error,
// while the commit runs on, uncancelled, to its end, under CommitTimeout
// rather than the caller's deadline.
func TestCommitOutlivesTheCaller(t *testing.T) {
	var c Committer
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	release, ended := make(chan struct{}), make(chan error, 1)
	go func() {
		ended <- c.Commit(ctx, func(c context.Context) error {
			<-release
			return c.Err() // a cancelled commit context would show here
		})
	}()
	cancel()
	err := <-ended
	if Of(err) != Unknown || !errors.Is(err, context.Canceled) {
		t.Fatalf("caller's ctx ended mid-commit: %v (%v); want Unknown wrapping context.Canceled", err, Of(err))
	}
	ran := make(chan error, 1)
	close(release)
	go func() {
		ran <- c.Commit(context.Background(), func(c context.Context) error { return c.Err() })
	}()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"caller's deadline past CommitTimeout", "caller without a deadline", "inline"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		c := &c
		switch name {
		case "caller without a deadline":
			ctx = context.Background()
		case "inline":
			c = Inline()
		}
		before := time.Now()
		if err := c.Commit(ctx, func(c context.Context) error {
			d, ok := c.Deadline()
			if !ok || d.Before(before.Add(CommitTimeout)) || d.After(time.Now().Add(CommitTimeout)) {
				return fmt.Errorf("commit deadline %v (%v); want CommitTimeout from the start", d, ok)
			}
			return nil
		}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		cancel()
	}
}

// Close waits for a commit its caller stopped waiting for; a commit after
// Close, and every commit of an Inline Committer, is waited for by its
// caller whatever its context does.
func TestCloseWaitsForCommitsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Committer
		ctx, cancel := context.WithCancel(context.Background())
		started, release := make(chan struct{}), make(chan struct{})
		finished := false
		go func() {
			err := c.Commit(ctx, func(context.Context) error {
				close(started)
				<-release
				finished = true
				return nil
			})
			if !errors.Is(err, ErrStoppedWaiting) {
				t.Errorf("caller's ctx ended mid-commit: %v; want ErrStoppedWaiting", err)
			}
		}()
		<-started
		cancel()
		closed := make(chan struct{})
		go func() { c.Close(); close(closed) }()
		synctest.Wait() // every goroutine blocked: the commit, and Close on it
		select {
		case <-closed:
			t.Fatal("Close returned while a commit was in flight")
		default:
		}
		close(release)
		<-closed
		if !finished {
			t.Fatal("Close returned before the commit ended")
		}
		c.Close() // idempotent

		for name, c := range map[string]*Committer{"after Close": &c, "inline": Inline()} {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			ran := false
			if err := c.Commit(ctx, func(c context.Context) error { ran = true; return c.Err() }); err != nil || !ran {
				t.Errorf("%s, with the caller's ctx ended: %v (ran %v); want the commit run to its end", name, err, ran)
			}
		}
	})
}
