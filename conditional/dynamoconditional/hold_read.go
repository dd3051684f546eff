package dynamoconditional

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
)

// MaxResources bounds the resources of one Free or HoldAny call.
const MaxResources = condcore.MaxResources

// HoldStatus is a resource's state as one read saw it, by this Holds'
// clock (WithClock). It is a snapshot: the resource may be held, released
// or confirmed right after the read.
type HoldStatus struct {
	Resource string
	// Holder holds the resource, or confirmed it; "" when it is free. A
	// hold past its end by this Holds' clock counts as free: anyone may
	// take it.
	Holder string
	// Until is the end of Holder's hold, as stored: on the clock of the
	// caller that held it (see Holds); zero when free or confirmed.
	Until time.Time
	// Confirmed means Holder has the resource for good: it is never held
	// again.
	Confirmed bool
}

// Get returns resource's holder and the end of its hold, or that it is
// free (a hold past its end by this Holds' clock counts as free), or
// ErrNotFound. It is one strongly consistent read (a BatchGetItem of one
// key: one read capacity unit for an item under 4 KB), and a snapshot: the resource may change
// right after. To hold a free resource, call Hold (or HoldAny): a read
// followed by a Hold is not atomic, but the Hold is.
func (h *Holds) Get(ctx context.Context, resource string) (HoldStatus, error) {
	s, err := condcore.Get(ctx, resource, h.read)
	if err != nil {
		return HoldStatus{}, err
	}
	return HoldStatus{Resource: resource, Holder: s.Holder, Until: s.Until, Confirmed: s.Confirmed}, nil
}

// Free returns those of resources that are free now (never held,
// released, or held past their end by this Holds' clock), in the order
// given. It reads the items with one strongly consistent BatchGetItem
// (one read capacity unit each for items under 4 KB; the keys DynamoDB
// leaves unprocessed are asked again after a backoff), judged by the clock
// when the answer came: each item read is a snapshot of that item, not of
// the set at one instant, and a Hold may change it right after. resources holds 1 to MaxResources names, each
// once; an unknown one is ErrNotFound naming it. Bad input is ErrInvalid,
// before any I/O.
func (h *Holds) Free(ctx context.Context, resources []string) ([]string, error) {
	return condcore.Free(ctx, resources, h.read)
}

// HoldAny holds one of resources for holder until ttl from now by this
// Holds' clock, and returns which one and that end (rounded down to whole
// milliseconds). Each resource is held as Hold holds it, by one
// conditional UpdateItem, so it never has two holders, and the hold
// expires, refreshes, confirms and releases as any other. If holder
// already holds one of them (a retried HoldAny), HoldAny holds that one
// again, as Hold would, rather than a second one. Otherwise it reads which
// are free and tries one picked at random, so concurrent callers spread
// over the free resources instead of all racing for the first; when
// another caller took it first, it reads those that were free again and
// tries one still free, until one is held or none is left.
//
// When none can be held it returns a *HoldError wrapping ErrHeld (naming
// the first resource, in sorted order, held by another) or, when every one
// is confirmed, ErrConfirmed (naming the first); each resource was seen
// unavailable at some moment during the call, and nothing changed. An
// unknown resource is a *HoldError wrapping ErrNotFound, before any hold.
// resources holds 1 to MaxResources names, each once (else ErrInvalid,
// before any I/O); the slice is not modified.
//
// Uncontended, it costs Free's read of the set (one strongly consistent
// BatchGetItem) and one conditional UpdateItem; each attempt that another
// caller won first adds one BatchGetItem of the resources still free and
// one UpdateItem. It needs no transactions. ErrAmbiguousCommit means a hold's outcome is unknown:
// retry HoldAny, which finds the hold if it applied.
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

// read returns the status of each of sorted that exists, by BatchGetItem
// (see batchGet), each item judged by the clock's reading when its call
// answered.
func (h *Holds) read(ctx context.Context, sorted []string) (map[string]condcore.Status, error) {
	items, err := batchGet(ctx, h.client, h.table, h.keys, sorted, HoldStateAttr, HolderAttr, HoldUntilAttr)
	if err != nil {
		return nil, errfmt.Errorf("read %d resources: %w", len(sorted), err)
	}
	now := h.clock().UnixMilli()
	read := make(map[string]condcore.Status, len(items))
	for r, item := range items {
		s, err := holdStatus(item, now)
		if err != nil {
			return nil, errfmt.Errorf("read %q: %w", r, err)
		}
		read[r] = s
	}
	return read, nil
}

// holdStatus reads a Holds item's state as of now (Unix ms).
func holdStatus(item map[string]types.AttributeValue, now int64) (condcore.Status, error) {
	state, _ := item[HoldStateAttr].(*types.AttributeValueMemberS)
	holder, _ := item[HolderAttr].(*types.AttributeValueMemberS)
	switch {
	case state == nil:
		return condcore.Status{}, errfmt.Errorf("conditional: item has no string attribute %q", HoldStateAttr)
	case state.Value == holdFree:
		return condcore.Status{}, nil
	case holder == nil:
		return condcore.Status{}, errfmt.Errorf("conditional: %s item has no string attribute %q", state.Value, HolderAttr)
	case state.Value == holdConfirmed:
		return condcore.Status{Holder: holder.Value, Confirmed: true}, nil
	}
	end, err := intAttr(item, HoldUntilAttr)
	if err != nil || end <= now {
		return condcore.Status{}, err
	}
	return condcore.Status{Holder: holder.Value, Until: time.UnixMilli(end)}, nil
}
