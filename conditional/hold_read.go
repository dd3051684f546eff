package conditional

import (
	"context"
	"time"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgmode"
)

// MaxResources bounds the resources of one Free or HoldAny call.
const MaxResources = condcore.MaxResources

// HoldStatus is a resource's state as one read saw it, by the database's
// clock. It is a snapshot: the resource may be held, released or
// confirmed right after the read.
type HoldStatus struct {
	Resource string
	// Holder holds the resource, or confirmed it; "" when it is free. A
	// hold past its end counts as free: anyone may take it.
	Holder string
	// Until is the end of Holder's hold, on the database's clock (compare
	// it only with that clock); zero when free or confirmed.
	Until time.Time
	// Confirmed means Holder has the resource for good: it is never held
	// again.
	Confirmed bool
}

// readSQL returns the state of the resources $1 by one reading of the
// database's clock, as parallel arrays: holder is empty for a free resource
// or an ended hold, hold_until NULL unless the hold is current.
func readSQL(t string) string {
	return `WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),
s AS (
  SELECT r.resource, r.holder, r.hold_until, r.state = 'confirmed' AS confirmed,
         r.state = 'held' AND r.hold_until > c.now AS current
  FROM c, ` + t + ` r WHERE r.resource = ANY($1))
SELECT coalesce(array_agg(resource), '{}'), coalesce(array_agg(confirmed), '{}'),
       coalesce(array_agg(CASE WHEN confirmed OR current THEN holder ELSE '' END), '{}'),
       coalesce(array_agg(CASE WHEN current THEN hold_until END), '{}')
FROM s`
}

// Get returns resource's holder and the end of its hold, or that it is
// free (a hold past its end counts as free), or ErrNotFound. It is one
// read of the row by primary key, taking no lock, and a snapshot: the
// resource may change right after. To hold a free resource, call Hold
// (or HoldAny): a read followed by a Hold is not atomic, but the Hold is.
func (h *Holds) Get(ctx context.Context, resource string) (HoldStatus, error) {
	s, err := condcore.Get(ctx, resource, h.read)
	if err != nil {
		return HoldStatus{}, err
	}
	return HoldStatus{Resource: resource, Holder: s.Holder, Until: s.Until, Confirmed: s.Confirmed}, nil
}

// Free returns those of resources that are free now (never held,
// released, or held past their end), in the order given. It is one
// statement reading every row at one instant of the database's clock,
// taking no lock: a snapshot, which a Hold may change right after.
// resources holds 1 to MaxResources names, each once; an unknown one is
// ErrNotFound naming it. Bad input is ErrInvalid, before any I/O.
func (h *Holds) Free(ctx context.Context, resources []string) ([]string, error) {
	return condcore.Free(ctx, resources, h.read)
}

// HoldAny holds one of resources for holder until ttl from now by the
// database's clock, and returns which one and that end. Each resource is
// held as Hold holds it, by one conditional statement, so it never has
// two holders, and the hold expires, refreshes, confirms and releases as
// any other. If holder already holds one of them (a retried HoldAny),
// HoldAny holds that one again, as Hold would, rather than a second one.
// Otherwise it reads which are free and tries one picked at random, so
// concurrent callers spread over the free resources instead of all racing
// for the first; when another caller took it first, it reads those that
// were free again and tries one still free, until one is held or none is
// left.
//
// When none can be held it returns a *HoldError wrapping ErrHeld (naming
// the first resource, in sorted order, held by another) or, when every one
// is confirmed, ErrConfirmed (naming the first); each resource was seen
// unavailable at some moment during the call, and nothing changed. An
// unknown resource is a *HoldError wrapping ErrNotFound, before any hold.
// resources holds 1 to MaxResources names, each once (else ErrInvalid,
// before any I/O); the slice is not modified.
//
// Uncontended, it costs two statements: one read of the set, one hold.
// Each attempt that another caller won first adds one read of the
// resources still free and one hold. ErrAmbiguousCommit means a
// hold's outcome is unknown: retry HoldAny, which finds the hold if it
// applied.
func (h *Holds) HoldAny(ctx context.Context, resources []string, holder string, ttl time.Duration) (resource string, until time.Time, err error) {
	return condcore.HoldAny(ctx, resources, holder, condcore.AnyOf{
		Read:     h.read,
		ValidTTL: func() error { return validTTL(ttl) },
		Hold:     func(ctx context.Context, r string) (time.Time, error) { return h.hold(ctx, r, holder, ttl) },
		Refuse:   func(r string, reason error) error { return &HoldError{Resource: r, Err: reason} },
		IntN:     h.intN,
		Obs:      h.obs,
	})
}

// read returns the status of each of sorted that exists.
func (h *Holds) read(ctx context.Context, sorted []string) (map[string]condcore.Status, error) {
	if err := ctx.Err(); err != nil {
		return nil, errfmt.Errorf("nothing sent: %w", err)
	}
	var names, holders []string
	var confirmed []bool
	var until []*time.Time
	if err := h.over.QueryRow(ctx, h.db, h.readSQL, sorted).Scan(&names, &confirmed, &holders, &until); err != nil {
		return nil, pgmode.Explain(err)
	}
	if len(confirmed) != len(names) || len(holders) != len(names) || len(until) != len(names) {
		return nil, errfmt.Errorf("read %d resources: arrays of %d, %d, %d", len(names), len(confirmed), len(holders), len(until))
	}
	read := make(map[string]condcore.Status, len(names))
	for i, r := range names {
		s := condcore.Status{Holder: holders[i], Confirmed: confirmed[i]}
		if until[i] != nil {
			s.Until = *until[i]
		}
		read[r] = s
	}
	return read, nil
}
