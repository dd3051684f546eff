package cas_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/cas"
	"github.com/nolock/nolock/cas/pgcas"
	"github.com/nolock/nolock/internal/testenv"
)

// A Retry that loses a race logs the retry at Debug; one out of attempts
// logs giving up at Warn; a Store logs its own key's retries.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	mustExec(t, pool, `CREATE TABLE docs (id int PRIMARY KEY, version bigint NOT NULL)`)
	mustExec(t, pool, `INSERT INTO docs VALUES (1, 1)`)
	// lose loses its first attempt to another writer.
	lose := func() func(ctx context.Context, tx pgx.Tx) error {
		first := true
		return func(ctx context.Context, tx pgx.Tx) error {
			var version int64
			if err := tx.QueryRow(ctx, `SELECT version FROM docs WHERE id = 1`).Scan(&version); err != nil {
				return err
			}
			if first {
				first = false
				mustExec(t, pool, `UPDATE docs SET version = version + 1 WHERE id = 1`)
			}
			return pgcas.Exec(ctx, tx, `UPDATE docs SET version = version + 1 WHERE id = 1 AND version = $1`, version)
		}
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := pgcas.Retry(ctx, pool, lose(), cas.WithLogger(log)); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, `level=DEBUG msg="cas: conflict; retrying" key="" attempt=1 delay=0s err="cas: version conflict"`) {
		t.Errorf("a Retry that lost once logged %q", out)
	}
	buf.Reset()
	if err := pgcas.Retry(ctx, pool, lose(), cas.WithAttempts(1), cas.WithLogger(log)); !errors.Is(err, cas.ErrConflict) {
		t.Fatalf("Retry with one attempt that lost: %v, want ErrConflict", err)
	}
	if out := buf.String(); !strings.Contains(out, `level=WARN msg="cas: gave up" key="" attempts=1 err="cas: version conflict"`) {
		t.Errorf("a Retry out of attempts logged %q", out)
	}

	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	s, err := cas.NewStore[int](b, nil, cas.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	other, err := cas.NewStore[int](b, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	key := testenv.Name("k")
	if err := s.Create(ctx, key, 1); err != nil {
		t.Fatal(err)
	}
	first := true
	_, err = s.Update(ctx, key, func(v int) (int, error) {
		if first { // another writer gets there first
			first = false
			if _, err := other.Update(ctx, key, func(v int) (int, error) { return v + 1, nil }); err != nil {
				return 0, err
			}
		}
		return v + 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, `msg="cas: conflict; retrying" key=`+key+` attempt=1`) {
		t.Errorf("a Store's Update that lost once logged %q", out)
	}
}

// WithLogger(nil) is accepted by Retry and NewStore, and logs nothing.
func TestLoggerNil(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := pgcas.Retry(ctx, pool, func(context.Context, pgx.Tx) error { return nil }, cas.WithLogger(nil)); err != nil {
		t.Fatal(err)
	}
	b, err := pgcas.NewBackend(pool)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cas.NewStore[int](b, nil, cas.WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
