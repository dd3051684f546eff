package partition

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nolock/nolock/internal/testenv"
)

// The fence statement on its own, against PostgreSQL: it moves the offset
// only at the claim's epoch and from the expected offset; a retry of a
// batch whose commit did land (a lost commit reply) is recognised as
// applied instead of being run again or reported as fenced.
func TestCheckFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Postgres(t)
	c, err := New(pool, []string{"unused:9092"}, "g", []string{"t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateSchema(ctx); err != nil {
		t.Fatalf("CreateSchema is not idempotent: %v", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO nolock_partition (group_id, topic, partition_id, epoch, next_offset) VALUES ('g', 't', 0, 5, 10)`); err != nil {
		t.Fatal(err)
	}
	at := func(epoch int64) Claim { return Claim{GroupID: "g", Topic: "t", Partition: 0, Epoch: epoch} }
	off := func(o int64) *int64 { return &o }
	fence := func(cl Claim, prev *int64, next int64, commit bool) (fenceOutcome, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer rollback(tx)
		o, err := c.checkFence(ctx, tx, cl, prev, next)
		if err == nil && commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return o, err
	}
	for _, tc := range []struct {
		name   string
		cl     Claim
		prev   *int64
		next   int64
		commit bool
		want   fenceOutcome
		fenced bool
	}{
		{"rolled back: no effect", at(5), off(10), 20, false, fenceHeld, false},
		{"my epoch, my offset", at(5), off(10), 20, true, fenceHeld, false},
		{"the same batch again after a lost commit reply", at(5), off(10), 20, false, fenceApplied, false},
		{"older epoch", at(4), off(20), 30, false, 0, true},
		{"newer epoch than stored (never granted)", at(6), off(20), 30, false, 0, true},
		{"my epoch, offset not where I left it", at(5), off(15), 30, false, 0, true},
		{"my epoch, no offset expected but one stored", at(5), nil, 30, false, 0, true},
		{"next batch", at(5), off(20), 30, true, fenceHeld, false},
	} {
		got, err := fence(tc.cl, tc.prev, tc.next, tc.commit)
		switch {
		case tc.fenced && !errors.Is(err, ErrFenced):
			t.Errorf("%s: got %v, %v; want ErrFenced", tc.name, got, err)
		case !tc.fenced && (err != nil || got != tc.want):
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	var next int64
	if err := pool.QueryRow(ctx, `SELECT next_offset FROM nolock_partition`).Scan(&next); err != nil || next != 30 {
		t.Fatalf("stored offset %d (%v), want 30", next, err)
	}

	// A missing row is fenced too (someone deleted it: never do that).
	if _, err := fence(Claim{GroupID: "g", Topic: "t", Partition: 1, Epoch: 1}, nil, 1, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("fence on a missing row: %v, want ErrFenced", err)
	}
}

// transient judges a database error by its SQLSTATE without assuming its
// length: a wrapper's PgError may carry a short or empty code.
func TestTransientCodes(t *testing.T) {
	for code, want := range map[string]bool{"": false, "5": false, "08006": true, "53300": true, "57014": true, "25P03": true, "55P03": true, "40001": true, "23505": false} {
		if got := transient(&pgconn.PgError{Code: code}, nil); got != want {
			t.Errorf("transient(code %q) = %v, want %v", code, got, want)
		}
	}
}
