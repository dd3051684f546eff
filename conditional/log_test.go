package conditional_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// A coalesced take whose statement fails logs it at Debug; one killed
// while it waits on the row lock, whose outcome is unknown, at Warn.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))

	missing, err := conditional.NewStock(pool, conditional.WithTable("missing"), conditional.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if err := missing.Take(ctx, "sku", 1); err == nil {
		t.Fatal("a take from a table that does not exist succeeded")
	}
	if out := buf.String(); !strings.Contains(out, `level=DEBUG msg="conditional: statement failed" op=take key=sku bucket=0 requests=1 err=`) {
		t.Errorf("a failed take logged %q", out)
	}

	buf.Reset()
	s, release := lockedStock(t, pool, conditional.WithLogger(log))
	defer release()
	took := make(chan error, 1)
	go func() { took <- s.Take(ctx, "sku", 1) }()
	killLockWaiters(t, pool)
	if err := <-took; !errors.Is(err, conditional.ErrAmbiguousCommit) {
		t.Fatalf("a take killed while sent: %v, want ErrAmbiguousCommit", err)
	}
	if out := buf.String(); !strings.Contains(out, `level=WARN msg="conditional: commit outcome unknown" op=take key=sku bucket=0 requests=1 err=`) {
		t.Errorf("a take of unknown outcome logged %q", out)
	}
}

// WithLogger(nil) is accepted by NewStock and NewAccounts.
func TestLoggerNil(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	s, err := conditional.NewStock(pool, conditional.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	a, err := conditional.NewAccounts(pool, conditional.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
}
