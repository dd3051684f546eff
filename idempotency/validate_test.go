package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/idempotency"
)

// noIO is a DB that fails the test on any use: bad input must be refused
// before any I/O.
type noIO struct{ t *testing.T }

func (d noIO) Acquire(context.Context) (*pgxpool.Conn, error) {
	d.t.Error("Acquire called")
	return nil, errors.New("no I/O")
}

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

// beginOnly is a DB with none of the types New accepts.
type beginOnly struct{ d noIO }

func (b beginOnly) Begin(ctx context.Context) (pgx.Tx, error) { return b.d.Begin(ctx) }
func (b beginOnly) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return b.d.Exec(ctx, sql, args...)
}
func (b beginOnly) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return b.d.QueryRow(ctx, sql, args...)
}

func TestBadInputIsRefusedBeforeIO(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := idempotency.New(noIO{t})
	if err != nil {
		t.Fatal(err)
	}
	fn := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
	for _, tc := range []struct {
		name, scope, key string
		fp               []byte
		fn               idempotency.Func
		names            string // the argument the error must name
	}{
		{"empty key", "", "", nil, fn, "key"},
		{"oversized key", "", strings.Repeat("k", idempotency.MaxKeyLen+1), nil, fn, "key"},
		{"NUL in key", "", "a\x00b", nil, fn, "key"},
		{"key not UTF-8", "", "\xff", nil, fn, "key"},
		{"oversized scope", strings.Repeat("s", idempotency.MaxScopeLen+1), "k", nil, fn, "scope"},
		{"NUL in scope", "\x00", "k", nil, fn, "scope"},
		{"oversized fingerprint", "", "k", make([]byte, idempotency.MaxFingerprintLen+1), fn, "fingerprint"},
		{"nil fn", "", "k", nil, nil, "fn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := store.Do(ctx, tc.scope, tc.key, tc.fp, tc.fn)
			if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Do: %v, want ErrInvalid naming %s", err, tc.names)
			}
			if tc.fn == nil {
				return // Exec takes no fn
			}
			_, err = store.Exec(ctx, tc.scope, tc.key, tc.fp, "SELECT 1")
			if !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("Exec: %v, want ErrInvalid naming %s", err, tc.names)
			}
		})
	}
	for _, sql := range []string{"", "  ", " ;\n"} {
		if _, err := store.Exec(ctx, "", "k", nil, sql); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "sql") {
			t.Fatalf("Exec with sql %q: %v, want ErrInvalid naming sql", sql, err)
		}
	}
	if _, err := store.Get(ctx, "", ""); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("Get with an empty key: %v", err)
	}
	for _, batch := range []int{0, -1, idempotency.MaxReapBatch + 1} {
		if _, err := store.Reap(ctx, batch); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "batch") {
			t.Fatalf("Reap(%d): %v, want ErrInvalid naming batch", batch, err)
		}
	}
	// The longest key and scope are fine (stopped here only by noIO).
	if err := idempotency.ValidKey(strings.Repeat("s", idempotency.MaxScopeLen), strings.Repeat("k", idempotency.MaxKeyLen)); err != nil {
		t.Fatalf("longest scope and key: %v", err)
	}
}

func TestNewRefusesBadSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		db    idempotency.DB
		opts  []idempotency.Option
		names string
	}{
		{"nil db", nil, nil, "db"},
		{"empty table", noIO{t}, []idempotency.Option{idempotency.WithTable("")}, "table"},
		{"long table", noIO{t}, []idempotency.Option{idempotency.WithTable(strings.Repeat("x", 53))}, "table is 53 bytes, more than 52"},
		{"zero retention", noIO{t}, []idempotency.Option{idempotency.WithRetention(0)}, "WithRetention"},
		{"negative retention", noIO{t}, []idempotency.Option{idempotency.WithRetention(-time.Hour)}, "WithRetention"},
		{"retention below 1ms", noIO{t}, []idempotency.Option{idempotency.WithRetention(time.Microsecond)}, "WithRetention"},
		{"retention past 100 years", noIO{t}, []idempotency.Option{idempotency.WithRetention(idempotency.MaxRetention + time.Microsecond)}, "WithRetention"},
		{"negative wait", noIO{t}, []idempotency.Option{idempotency.WithWait(-time.Second)}, "WithWait"},
		{"wait past lock_timeout", noIO{t}, []idempotency.Option{idempotency.WithWait(30 * 24 * time.Hour)}, "PostgreSQL's longest lock_timeout"},
		{"zero attempts", noIO{t}, []idempotency.Option{idempotency.WithAttempts(0)}, "WithAttempts"},
		{"neither pool, conn nor tx", beginOnly{noIO{t}}, nil, "pass a *pgxpool.Pool (or a type with its Acquire method), a *pgx.Conn or a pgx.Tx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := idempotency.New(tc.db, tc.opts...); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("New: %v, want ErrInvalid naming %s", err, tc.names)
			}
		})
	}
}
