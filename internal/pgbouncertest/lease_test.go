package pgbouncertest

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/lease"
)

// leaseScenario: a lock, a FenceSQL write by its holder and after its
// release, and the next token.
var leaseScenario = scenario{"lease.Client", func(ctx context.Context, b *bed, w string) error {
	k := w + "-leader"
	if _, err := b.admin.Exec(ctx, `INSERT INTO reports VALUES ($1, '')`, k); err != nil {
		return err
	}
	// The user's fenced write, in a transaction: describe_exec sends a
	// statement outside one in two round trips, which PgBouncer may
	// give to two server connections.
	write := func(token int64, body string) (n int64, err error) {
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE reports SET body = $3 WHERE id = $1 AND `+b.locks.FenceSQL(1, 2), slices.Concat(b.own, []any{k, token, body})...)
			n = tag.RowsAffected()
			return err
		})
		return n, err
	}
	l, err := b.locks.Acquire(ctx, k)
	if err != nil {
		return fmt.Errorf("Acquire: %w", err)
	}
	_, held := b.locks.TryAcquire(ctx, k)
	n, werr := write(l.Token(), "holder")
	if err := errors.Join(want("TryAcquire of a held lock", held, lease.ErrNotAcquired), want("fenced write", werr, nil),
		want("Release", l.Release(ctx), nil)); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("fenced write by the holder wrote %d rows, want 1", n)
	}
	if n, err = write(l.Token(), "stale"); err != nil || n != 0 {
		return fmt.Errorf("fenced write after the release: %d rows, %v; want 0", n, err)
	}
	next, err := b.locks.TryAcquire(ctx, k)
	if err != nil {
		return fmt.Errorf("TryAcquire after the release: %w", err)
	}
	if next.Token() != l.Token()+1 {
		return fmt.Errorf("token after the release: %d, want %d", next.Token(), l.Token()+1)
	}
	var body string
	if err := b.admin.QueryRow(ctx, `SELECT body FROM reports WHERE id = $1`, k).Scan(&body); err != nil || body != "holder" {
		return fmt.Errorf("the report: %q, %v; want \"holder\"", body, err)
	}
	return want("Release of the next lock", next.Release(ctx), nil)
}}
