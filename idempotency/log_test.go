package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/idempotency"
)

// A replay and a mismatch log at Debug; a serialization failure's retry at
// Debug, and running out of attempts at Warn; Reap its count at Debug.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b := newBed(t, idempotency.WithLogger(log))
	// serialization fails its first run with 40001.
	serialization := func() idempotency.Func {
		first := true
		return func(context.Context, pgx.Tx) ([]byte, error) {
			if first {
				first = false
				return nil, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
			}
			return []byte("ok"), nil
		}
	}
	for _, fp := range []string{"a", "a", "b"} {
		_, _ = b.store.Do(ctx, "alice", "k1", []byte(fp), serialization())
	}
	if _, err := b.store.Reap(ctx, 10); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="idempotency: conflict; retrying" key=k1 attempt=1 delay=`,
		`level=DEBUG msg="idempotency: replayed" key=k1`,
		`level=DEBUG msg="idempotency: key reused with another request" key=k1 err=`,
		`level=DEBUG msg="idempotency: reaped" deleted=0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("logged %q, want %q", out, want)
		}
	}

	buf.Reset()
	once, err := idempotency.New(b.pool, idempotency.WithAttempts(1), idempotency.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if _, err := once.Do(ctx, "alice", "k2", nil, serialization()); !errors.As(err, &pgErr) {
		t.Fatalf("Do with one attempt that failed to serialize: %v", err)
	}
	if out := buf.String(); !strings.Contains(out, `level=WARN msg="idempotency: gave up" key=k2 attempts=1 err=`) {
		t.Errorf("a Do out of attempts logged %q", out)
	}
}

// WithLogger(nil) is accepted, and the Store works.
func TestLoggerNil(t *testing.T) {
	t.Parallel()
	b := newBed(t, idempotency.WithLogger(nil))
	if _, err := b.store.Do(context.Background(), "alice", "k", nil, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
}
