package dynamoconditional_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// A Hold that meets transactions in progress on its item logs each retry
// at Debug, and running out of attempts at Warn.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	updates := &conflicts{op: "UpdateItem"}
	client := dynamoClientVia(t, false, func(next http.RoundTripper) http.RoundTripper {
		updates.next = next
		return updates
	})
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h, err := dynamoconditional.NewHolds(client, testenv.Table(t, client, false), dynamoconditional.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	updates.left.Store(2)
	if _, err := h.Hold(ctx, "s1", "alice", time.Minute); err != nil {
		t.Fatalf("Hold after two conflicts: %v", err)
	}
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="conditional: conflict; retrying" key=s1 attempt=1 delay=`,
		`level=DEBUG msg="conditional: conflict; retrying" key=s1 attempt=2 delay=`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("a Hold that met two conflicts logged %q, want %q", out, want)
		}
	}
	buf.Reset()
	updates.left.Store(1 << 40)
	if _, err := h.Hold(ctx, "s1", "alice", time.Minute); !errors.Is(err, dynamoconditional.ErrConflict) {
		t.Fatalf("Hold under endless conflicts: %v, want ErrConflict", err)
	}
	updates.left.Store(0)
	if out := buf.String(); !strings.Contains(out, `level=WARN msg="conditional: gave up" key=s1 attempts=10 err=`) {
		t.Errorf("a Hold out of attempts logged %q", out)
	}
}

// WithLogger(nil) is accepted by NewStock and NewHolds, beside their own
// options.
func TestLoggerNil(t *testing.T) {
	t.Parallel()
	client := testenv.DynamoDB(t)
	if _, err := dynamoconditional.NewStock(client, "tbl", dynamoconditional.WithLogger(nil), dynamoconditional.WithBuckets(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := dynamoconditional.NewHolds(client, "tbl", dynamoconditional.WithLogger(nil), dynamoconditional.WithClock(time.Now)); err != nil {
		t.Fatal(err)
	}
}
