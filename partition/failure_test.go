package partition_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// raise makes the handler's statement fail with SQLSTATE code, as the
// server would (a serialization failure, a deadlock).
func raise(ctx context.Context, tx pgx.Tx, code string) error {
	_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '`+code+`'; END $$`)
	return err
}

// One classification of a Handler's failures, inbox's: a Permanent error
// parks at once; a serialization failure or deadlock is the database's
// trouble, retried without counting, up to WithAttempts in a row, so a
// message that meets it once is applied and one that meets it every time
// is still parked, after exactly 2 × WithAttempts calls.
func TestHandlerFailureKinds(t *testing.T) {
	t.Parallel()
	permanent := errors.New("malformed payload")
	for _, tc := range []struct {
		name      string
		attempts  int
		fail      func(ctx context.Context, tx pgx.Tx, call int64) error // for offset 1
		calls     int64                                                  // of the handler on offset 1
		parked    int                                                    // attempts of the parked row; 0: not parked
		parkedErr string
	}{
		{"permanent", 5, func(context.Context, pgx.Tx, int64) error { return partition.Permanent(permanent) }, 1, 1, "malformed payload"},
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
			ctx := context.Background()
			b := newBed(t, 1)
			produce(t, b.brokers, b.topic, 1, 0, 3)
			rec := record("m")
			var calls atomic.Int64
			cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
				if msgs[0].Offset == 1 {
					if err := tc.fail(ctx, tx, calls.Add(1)); err != nil {
						return err
					}
				}
				return rec(ctx, tx, msgs)
			})
			cfg.with(partition.WithAttempts(tc.attempts), partition.WithMaxBatch(1))
			var parked parkLog
			cfg.with(partition.WithObserver(observe.Func(parked.observe)))
			m := startMember(t, b.pool, cfg)
			want := 3
			if tc.parked > 0 {
				want = 2
			}
			if err := waitRows(ctx, b.pool, want); err != nil {
				t.Fatal(err)
			}
			testenv.Until(t, "the stored offset at 3", func() (bool, error) {
				r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
				return r.next != nil && *r.next == 3, err
			})
			if err := m.stop(); err != nil {
				t.Fatalf("Run: %v; want nil", err)
			}
			rows, err := readParked(ctx, b.pool, b.group, b.topic)
			if err != nil {
				t.Fatal(err)
			}
			msgs, errs := parked.snapshot()
			switch {
			case calls.Load() != tc.calls:
				t.Fatalf("handler called %d times on offset 1, want %d", calls.Load(), tc.calls)
			case tc.parked == 0 && (len(rows) != 0 || len(msgs) != 0):
				t.Fatalf("parked %+v (events %v), want nothing", rows, msgs)
			case tc.parked > 0 && (len(rows) != 1 || rows[0].offset != 1 || rows[0].attempts != tc.parked || !strings.Contains(rows[0].errText, tc.parkedErr)):
				t.Fatalf("parked %+v, want offset 1 after %d attempts with %q", rows, tc.parked, tc.parkedErr)
			case tc.parked > 0 && (len(errs) != 1 || !errors.As(errs[0], new(*partition.HandlerError))):
				t.Fatalf("parked events' errors %v, want one *HandlerError", errs)
			}
			if tc.name == "permanent" && !partition.IsPermanent(errs[0]) {
				t.Fatalf("parked with %v, want an error IsPermanent reports", errs[0])
			}
		})
	}
}

// A Permanent error from a batch of several splits it at once, and the
// message that fails alone is parked on that first attempt: the Handler
// sees it alone once, whatever WithAttempts says.
func TestPermanentInABatchParksAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 6)
	rec := record("m")
	var alone atomic.Int64
	cfg := b.config("m", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		for _, m := range msgs {
			if m.Offset == 3 {
				if len(msgs) == 1 {
					alone.Add(1)
				}
				return partition.Permanent(errors.New("malformed payload"))
			}
		}
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithAttempts(5))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, 5); err != nil {
		t.Fatal(err)
	}
	testenv.Until(t, "the stored offset at 6", func() (bool, error) {
		r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
		return r.next != nil && *r.next == 6, err
	})
	if err := m.stop(); err != nil {
		t.Fatalf("Run: %v; want nil", err)
	}
	rows, err := readParked(ctx, b.pool, b.group, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].offset != 3 || rows[0].attempts != 1 || alone.Load() != 1 {
		t.Fatalf("parked %+v after %d calls alone; want offset 3 after 1 attempt, 1 call", rows, alone.Load())
	}
}
