package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nolock/nolock/idempotency"
)

// Exec never runs a statement unchecked. One whose parameter the server
// cannot type from the statement alone (42P18), given through a
// simple-protocol pool where only the sent value types it, is checked
// with the arguments' types: a missing argument whose parameter the
// server still cannot type is refused (it would bind Exec's own
// lock_timeout), one with all its arguments runs, and one with an argument
// too many is refused having run nothing.
func TestExecChecksUndescribableStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	store, err := idempotency.New(simpleProtocolPool(t, b.schema))
	if err != nil {
		t.Fatal(err)
	}
	const sql = `SELECT $1::text AS a, $2 IS NULL AS b`
	if _, err := store.Exec(ctx, "s", "k1", nil, sql, "x"); !errors.Is(err, idempotency.ErrInvalid) || !strings.Contains(err.Error(), "cast") {
		t.Fatalf("Exec with one of two arguments, the second untyped: %v; want ErrInvalid saying to cast", err)
	}
	if _, err := store.Get(ctx, "s", "k1"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record after the refused call: %v, want ErrNotFound", err)
	}
	if res, err := store.Exec(ctx, "s", "k2", nil, sql, "x", "y"); err != nil || string(res.Body) != `[{"a":"x","b":false}]` {
		t.Fatalf("Exec with both arguments: %+v, %v", res, err)
	}
	if _, err := store.Exec(ctx, "s", "k3", nil, `SELECT $1 IS NULL AS n`, "x", "y"); err == nil || errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Exec with two arguments for one untyped parameter: %v, want a refusal", err)
	}
	if _, err := store.Get(ctx, "s", "k3"); !errors.Is(err, idempotency.ErrNotFound) {
		t.Fatalf("record after the refused call: %v, want ErrNotFound", err)
	}
}

// A describe the server refuses (a table not created yet) fails the call
// with the server's error, having run nothing; once the table exists the
// statement is described again, checked and run.
func TestExecDescribeRefusedFailsTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t)
	const sql = `UPDATE later SET n = n + 1 WHERE id = $1 RETURNING n`
	if _, err := b.store.Exec(ctx, "s", "k", nil, sql, int64(1)); err == nil || !strings.Contains(err.Error(), "describe") || errors.Is(err, idempotency.ErrAmbiguousCommit) {
		t.Fatalf("Exec on a missing table: %v; want the describe's refusal", err)
	}
	mustExec(t, b.pool, `CREATE TABLE later (id bigint PRIMARY KEY, n bigint NOT NULL); INSERT INTO later VALUES (1, 0)`)
	if _, err := b.store.Exec(ctx, "s", "k", nil, sql); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("Exec without its argument once the table exists: %v, want ErrInvalid", err)
	}
	if res, err := b.store.Exec(ctx, "s", "k", nil, sql, int64(1)); err != nil || string(res.Body) != `[{"n":1}]` {
		t.Fatalf("Exec once the table exists: %+v, %v", res, err)
	}
}
