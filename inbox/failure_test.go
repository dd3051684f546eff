package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// raise makes the handler's statement fail with SQLSTATE code, as the
// server would (a serialization failure, a deadlock).
func raise(ctx context.Context, tx pgx.Tx, code string) error {
	_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '`+code+`'; END $$`)
	return err
}

// One classification of a handler's failures, partition's: a Permanent
// error (either package's) parks at once; a serialization failure or
// deadlock is the database's trouble, retried without counting, up to
// WithAttempts in a row, so a message that meets it once is applied and
// one that meets it every time is still parked, after exactly 2 ×
// WithAttempts calls.
func TestHandlerFailureKinds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		attempts  int
		fail      func(ctx context.Context, tx pgx.Tx, call int64) error // for m1
		calls     int64                                                  // of the handler on m1
		parked    int                                                    // attempts of the parked row; 0: not parked
		parkedErr string
	}{
		{"permanent", 5, func(context.Context, pgx.Tx, int64) error { return inbox.Permanent(errors.New("malformed payload")) }, 1, 1, "malformed payload"},
		{"partition's permanent", 5, func(context.Context, pgx.Tx, int64) error {
			return partition.Permanent(errors.New("malformed payload"))
		}, 1, 1, "malformed payload"},
		{"serialization failure once", 1, func(ctx context.Context, tx pgx.Tx, call int64) error {
			if call == 1 {
				return raise(ctx, tx, "40001")
			}
			return nil
		}, 2, 0, ""},
		{"deadlock every time", 2, func(ctx context.Context, tx pgx.Tx, _ int64) error { return raise(ctx, tx, "40P01") }, 4, 2, "SQLSTATE 40P01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := testenv.Postgres(t)
			parked, hook := parkCounter()
			in := newInbox(t, pool, hook, inbox.WithAttempts(tc.attempts), inbox.WithMaxBatch(1))
			var calls atomic.Int64
			h := func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
				if string(m.Value) == "v-m1" {
					if err := tc.fail(ctx, tx, calls.Add(1)); err != nil {
						return err
					}
				}
				return record(ctx, tx, m)
			}
			want := 3
			if tc.parked > 0 {
				want = 2
			}
			runSlice(t, in, []kafka.Message{msg("m0", 0, 0), msg("m1", 0, 1), msg("m2", 0, 2)}, h, func() bool {
				return len(effects(t, pool)) == want && parked.Load() == int64(min(tc.parked, 1))
			})
			all := listAll(t, in)
			switch {
			case calls.Load() != tc.calls:
				t.Fatalf("handler called %d times on m1, want %d", calls.Load(), tc.calls)
			case tc.parked == 0 && len(all) != 0:
				t.Fatalf("parked %+v, want nothing", all)
			case tc.parked > 0 && (len(all) != 1 || all[0].ID.Offset != 1 || all[0].Attempts != tc.parked || !strings.Contains(all[0].Error, tc.parkedErr)):
				t.Fatalf("parked %+v, want m1 after %d attempts with %q", all, tc.parked, tc.parkedErr)
			}
			if n := count(t, pool, `SELECT count(*) FROM nolock_inbox_attempts`); n != 0 {
				t.Fatalf("%d attempt counters left, want 0", n)
			}
		})
	}
}
