package conditional

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

// Holds hands out timed holds on resources (seats, slots, rooms) in a
// PostgreSQL table, and lets a holder confirm or release its hold, without
// a lock service: each change is one conditional UPDATE, and the row
// decides.
//
// A resource is free, held (by one holder, until a time on the database's
// clock) or confirmed (final). Expiry is judged only by the database
// server's clock (clock_timestamp()), never by a client's, so holders on
// machines with skewed clocks still agree on who holds what. A statement
// that waited for another transaction's lock on the row may judge by the
// time before the wait; it never lets two holders hold one resource, because
// every change is conditional on the row's newest version.
//
// A hold protects only what Confirm decides: the database refuses to
// confirm an expired hold, but work a holder does elsewhere while it thinks
// it holds is not fenced (see Fenced). Holds never deletes a row.
//
// A Holds on a pool is safe for concurrent use; on a *pgx.Conn or a pgx.Tx
// use it from one goroutine at a time (see DB). A commit whose caller
// stopped waiting (its ctx ended) runs on to its end, at most
// pgoutcome.CommitTimeout; Close waits for those (on a *pgx.Conn the call
// waits instead). It is cheap to make: to confirm in the same transaction
// as your own writes (the order, the payment), make one with NewHolds on
// that pgx.Tx; one made on a pgx.Tx commits nothing itself and needs no
// Close.
type Holds struct {
	db   DB
	obs  observe.Observer
	pg   *pgerr.Committer // its writes; Close waits for their commits
	over pgmode.Override  // for statements on db outside a transaction
	intN func(int) int    // HoldAny's shuffle

	schemaSQL, addSQL, holdSQL, lockSQL, holdAllSQL, confirmSQL, releaseSQL, readSQL string
}

//go:embed hold.sql
var holdSQL string

// DefaultHoldsTable is the holds table's name unless WithTable says
// otherwise.
const DefaultHoldsTable = "nolock_holds"

// NewHolds returns a Holds on db: a *pgxpool.Pool (the usual), a
// *pgx.Conn or a pgx.Tx (see DB for what each gives). Run its
// CreateSchema (or put its Schema in your migrations) first.
func NewHolds(db DB, opts ...Option) (*Holds, error) {
	cfg := config{table: DefaultHoldsTable}
	if err := apply(&cfg, opts, "NewHolds", holdsSetters); err != nil {
		return nil, err
	}
	if pgarg.NilDB(db) {
		return nil, condcore.Invalid("db is nil")
	}
	if err := pgarg.Ident("table", cfg.table, 0); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	t := pgx.Identifier{cfg.table}.Sanitize()
	// $3 is the TTL in microseconds, the resolution of timestamptz.
	const until = `$3::bigint * interval '1 microsecond'`
	pg := new(pgerr.Committer)
	if _, conn := db.(*pgx.Conn); conn {
		pg = pgerr.Inline() // each call waits for its commit: the connection is free when it returns
	}
	return &Holds{
		db:        db,
		obs:       cfg.obs,
		pg:        pg,
		over:      pg.For(db),
		intN:      rand.IntN,
		readSQL:   readSQL(t),
		schemaSQL: strings.ReplaceAll(holdSQL, "{{table}}", t),
		// Sorted and deduplicated by Add, so concurrent Adds take the
		// index's insertion locks in one order.
		addSQL: `INSERT INTO ` + t + ` (resource) SELECT unnest($1::text[]) ON CONFLICT (resource) DO NOTHING`,
		// One statement: u holds the row if it is free, held by this holder,
		// or held past its end; the outer SELECT reads the row as it was
		// when the statement began, only to name the refusal.
		holdSQL: `WITH u AS (
  UPDATE ` + t + ` SET state = 'held', holder = $2, hold_until = clock_timestamp() + ` + until + `
  WHERE resource = $1 AND (state = 'free' OR (state = 'held' AND (holder = $2 OR hold_until <= clock_timestamp())))
  RETURNING hold_until)
SELECT (SELECT hold_until FROM u), (SELECT state FROM ` + t + ` WHERE resource = $1)`,
		// Rows are locked in byte order of resource (Go's string order),
		// the only order any multi-row locker here uses; single-resource
		// statements lock one row.
		lockSQL: `SELECT resource, state FROM ` + t + ` WHERE resource = ANY($1) ORDER BY resource COLLATE "C" FOR UPDATE`,
		// With every row locked, one clock reading decides them all.
		holdAllSQL: `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
UPDATE ` + t + ` r SET state = 'held', holder = $2, hold_until = c.now + ` + until + `
FROM c
WHERE r.resource = ANY($1) AND (r.state = 'free' OR (r.state = 'held' AND (r.holder = $2 OR r.hold_until <= c.now)))
RETURNING r.resource, r.hold_until`,
		// Confirming again is a no-op success, so a retried Confirm is safe.
		confirmSQL: `WITH u AS (
  UPDATE ` + t + ` SET state = 'confirmed', hold_until = NULL
  WHERE resource = $1 AND holder = $2 AND (state = 'confirmed' OR (state = 'held' AND hold_until > clock_timestamp()))
  RETURNING 1)
SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM ` + t + ` WHERE resource = $1)`,
		releaseSQL: `WITH u AS (
  UPDATE ` + t + ` SET state = 'free', holder = NULL, hold_until = NULL
  WHERE resource = $1 AND holder = $2 AND state = 'held'
  RETURNING 1)
SELECT EXISTS (SELECT FROM u), EXISTS (SELECT FROM ` + t + ` WHERE resource = $1)`,
	}, nil
}

// Add creates free resources; those that exist already are left as they
// are, so Add is idempotent. Add with no resources does nothing.
func (h *Holds) Add(ctx context.Context, resources ...string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArgs("resources", resources); err != nil {
		return err
	}
	if len(resources) == 0 {
		return nil
	}
	if err := condcore.Unsent(ctx, "add resources"); err != nil {
		return err
	}
	sorted := slices.Clone(resources)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	if _, err := h.pg.Exec(ctx, h.db, h.addSQL, h.over.Args(sorted)...); err != nil {
		return errfmt.Errorf("conditional: add resources: %w", classifyOn(h.db, err))
	}
	return nil
}

// Hold holds resource for holder until ttl from now by the database's
// clock, and returns that end, read from the database's clock (compare it
// only with that clock). It succeeds when the resource is free, when its
// hold has expired, or when holder holds it already: then the hold is
// reset to end ttl from now (which may shorten it), so a retried Hold is
// idempotent. Otherwise it returns a *HoldError wrapping ErrHeld (another
// holder's hold has not expired), ErrConfirmed or ErrNotFound (no such
// resource; see Add), and nothing changed.
//
// To act on a hold in the client, measure ttl on your own monotonic clock
// from before the call: that ends no later than the database's hold. The
// TTL is rounded down to whole microseconds.
//
// Hold is one statement. The reason for a refusal is read from the row as
// it was when the statement began, so a hold refused after waiting for a
// concurrent change may report ErrHeld where the row is now confirmed, or
// free again; either way it was not yours. ErrAmbiguousCommit means the
// connection failed after the statement was sent; Hold is idempotent, so
// retry it.
func (h *Holds) Hold(ctx context.Context, resource, holder string, ttl time.Duration) (until time.Time, err error) {
	return condcore.Observed(ctx, h.obs, condcore.Hold, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) (time.Time, error) {
		return h.hold(ctx, resource, holder, ttl)
	})
}

func (h *Holds) hold(ctx context.Context, resource, holder string, ttl time.Duration) (time.Time, error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return time.Time{}, err
	}
	if err := condcore.ValidArg("resource", resource); err != nil {
		return time.Time{}, err
	}
	if err := condcore.ValidArg("holder", holder); err != nil {
		return time.Time{}, err
	}
	if err := validTTL(ttl); err != nil {
		return time.Time{}, err
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("hold %q", resource)); err != nil {
		return time.Time{}, err
	}
	var got *time.Time
	var state *string
	if err := h.pg.Row(ctx, h.db, h.holdSQL, h.over.Args(resource, holder, ttl.Microseconds())...).Scan(&got, &state); err != nil {
		return time.Time{}, errfmt.Errorf("conditional: hold %q: %w", resource, classifyOn(h.db, err))
	}
	switch {
	case got != nil:
		return *got, nil
	case state == nil:
		return time.Time{}, &HoldError{Resource: resource, Err: ErrNotFound}
	case *state == "confirmed":
		return time.Time{}, &HoldError{Resource: resource, Err: ErrConfirmed}
	default:
		return time.Time{}, &HoldError{Resource: resource, Err: ErrHeld}
	}
}

// HoldAll holds every one of resources for holder, or none of them, in one
// transaction, with the same rule per resource as Hold and one end for all,
// which it returns. When any resource cannot be held it returns a
// *HoldError naming it (an unknown resource if there is one, else the
// first unavailable one in sorted order) and nothing was held or changed.
//
// HoldAll locks the rows in sorted order, so overlapping HoldAlls and
// single-resource calls never deadlock one another; a Holds made on a
// caller's transaction that already holds other row locks is outside that
// promise. Duplicate or empty entries are ErrInvalid; the slice is not
// modified. HoldAll is idempotent like Hold; ErrAmbiguousCommit means the
// commit's outcome is unknown.
func (h *Holds) HoldAll(ctx context.Context, resources []string, holder string, ttl time.Duration) (until time.Time, err error) {
	e := observe.Event{Key: condcore.HoldAllKey(h.obs, resources), N: int64(len(resources))}
	return condcore.Observed(ctx, h.obs, condcore.HoldAll, true, e, func(ctx context.Context) (time.Time, error) {
		return h.holdAll(ctx, resources, holder, ttl)
	})
}

func (h *Holds) holdAll(ctx context.Context, resources []string, holder string, ttl time.Duration) (until time.Time, err error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return time.Time{}, err
	}
	if len(resources) == 0 {
		return time.Time{}, condcore.Invalid("resources is empty")
	}
	if err := condcore.ValidArgs("resources", resources); err != nil {
		return time.Time{}, err
	}
	if err := condcore.ValidArg("holder", holder); err != nil {
		return time.Time{}, err
	}
	if err := validTTL(ttl); err != nil {
		return time.Time{}, err
	}
	sorted := slices.Clone(resources)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return time.Time{}, condcore.Invalid("resources has %q twice", sorted[i])
		}
	}

	fail := func(err error) (time.Time, error) {
		return time.Time{}, errfmt.Errorf("conditional: hold %d resources: %w", len(sorted), pgmode.Explain(err))
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("hold %d resources", len(sorted))); err != nil {
		return time.Time{}, err
	}
	tx, err := h.pg.Begin(ctx, h.db)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	rows, err := tx.Query(ctx, h.lockSQL, sorted)
	if err != nil {
		return fail(err)
	}
	state := make(map[string]string, len(sorted))
	var r, st string
	if _, err := pgx.ForEachRow(rows, []any{&r, &st}, func() error { state[r] = st; return nil }); err != nil {
		return fail(err)
	}
	for _, r := range sorted {
		if _, ok := state[r]; !ok {
			return time.Time{}, &HoldError{Resource: r, Err: ErrNotFound}
		}
	}

	rows, err = tx.Query(ctx, h.holdAllSQL, sorted, holder, ttl.Microseconds())
	if err != nil {
		return fail(err)
	}
	held := make(map[string]bool, len(sorted))
	if _, err := pgx.ForEachRow(rows, []any{&r, &until}, func() error { held[r] = true; return nil }); err != nil {
		return fail(err)
	}
	for _, r := range sorted {
		if !held[r] {
			// The row is locked by this transaction: its state is current.
			if state[r] == "confirmed" {
				return time.Time{}, &HoldError{Resource: r, Err: ErrConfirmed}
			}
			return time.Time{}, &HoldError{Resource: r, Err: ErrHeld}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(classifyOn(h.db, err))
	}
	return until, nil
}

// Confirm makes holder's hold on resource final: the resource stays
// holder's and is never held again. It succeeds only while the hold has
// not expired by the database's clock; confirming again what holder
// confirmed already succeeds, so a retried Confirm is safe. Otherwise it
// returns ErrNotHolder (free, held by another, confirmed by another, or
// holder's hold expired, even if no one has taken it since) or
// ErrNotFound, and nothing changed.
//
// Confirm is one statement. To confirm in the same transaction as your own
// writes, make a Holds on that pgx.Tx: the confirmation then commits or
// rolls back with them.
func (h *Holds) Confirm(ctx context.Context, resource, holder string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	return condcore.ObservedErr(ctx, h.obs, condcore.Confirm, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) error {
		return h.settle(ctx, "confirm", h.confirmSQL, resource, holder)
	})
}

// Release frees resource if holder holds it, expired or not. Otherwise it
// returns ErrNotHolder (free, held by another, or confirmed) or
// ErrNotFound, and nothing changed. A retried Release whose first attempt
// freed the resource returns ErrNotHolder: either way holder does not hold
// it. Release is one statement.
func (h *Holds) Release(ctx context.Context, resource, holder string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	return condcore.ObservedErr(ctx, h.obs, condcore.Release, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) error {
		return h.settle(ctx, "release", h.releaseSQL, resource, holder)
	})
}

// settle runs Confirm's or Release's statement, which returns whether it
// changed the row and whether the row existed when it began.
func (h *Holds) settle(ctx context.Context, op, sql, resource, holder string) error {
	if err := condcore.ValidArg("resource", resource); err != nil {
		return err
	}
	if err := condcore.ValidArg("holder", holder); err != nil {
		return err
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("%s %q", op, resource)); err != nil {
		return err
	}
	var done, exists bool
	if err := h.pg.Row(ctx, h.db, sql, h.over.Args(resource, holder)...).Scan(&done, &exists); err != nil {
		return errfmt.Errorf("conditional: %s %q: %w", op, resource, classifyOn(h.db, err))
	}
	switch {
	case done:
		return nil
	case !exists:
		return errfmt.Errorf("conditional: %s %q: %w", op, resource, ErrNotFound)
	default:
		return errfmt.Errorf("conditional: %s %q: %w", op, resource, ErrNotHolder)
	}
}

// Schema returns the DDL of the Holds' table, for migration tools.
func (h *Holds) Schema() string { return h.schemaSQL }

// CreateSchema creates the Holds' table if it does not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (h *Holds) CreateSchema(ctx context.Context) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := pgschema.Create(ctx, h.db, h.schemaSQL); err != nil {
		return errfmt.Errorf("conditional: create schema: %w", err)
	}
	return nil
}

// validTTL checks a hold's TTL: at least the database's resolution.
func validTTL(ttl time.Duration) error {
	if ttl < time.Microsecond {
		return condcore.Invalid("ttl %v is below 1µs", ttl)
	}
	return nil
}

// Close waits for the commits in flight whose callers stopped waiting
// (each bounded by pgoutcome.CommitTimeout). It is idempotent and safe to
// call concurrently. A write after Close still works, its caller waiting
// for its commit whatever ctx does; the database handle is the caller's to
// close.
func (h *Holds) Close() error {
	h.pg.Close()
	return nil
}
