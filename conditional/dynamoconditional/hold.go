package dynamoconditional

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/observe"
)

// Holds is conditional.Holds on DynamoDB: timed holds on resources (seats,
// slots, rooms), which a holder confirms or releases, without a lock
// service. Each change is one conditional UpdateItem (HoldAll: one
// TransactWriteItems), and the item decides.
//
// Item layout: one item per resource, whose partition key
// (WithKeyAttributes, default "pk", a string) is the resource's name, with HoldStateAttr
// ("free", "held" or "confirmed"), HolderAttr (held or confirmed)
// and HoldUntilAttr (held only). Add creates the items; nothing here
// deletes one. Keep other items out of the table.
//
// The clock. DynamoDB has no clock a condition can read, so a hold's end
// is an absolute instant, Unix milliseconds on the clock of the caller
// that held it (WithClock, default time.Now), and each call
// judges ends by its own caller's clock, sent as ":now". What this
// guarantees, however far apart the callers' clocks are: every write is
// conditioned on the item's holder, so the item names one holder at a
// time, two holders never both confirm one resource, and a confirmed
// resource is never held again. What it does not: agreement on when a
// hold ends. A caller whose clock runs d ahead of the holder's sees the
// hold end d early and may take it over then, while the holder still
// believes it holds; a holder whose clock runs d behind the others' may
// confirm its own hold up to d after its end, if nobody took it meanwhile.
// So skew between callers moves when a hold is seen as expired, by that
// skew, and nothing else: keep clocks synchronised and TTLs long against
// their skew. (conditional.Holds, on PostgreSQL, judges by the database's
// clock alone.)
//
// A hold protects only what Confirm decides: work a holder does elsewhere
// while it thinks it holds is not fenced (see Fenced). Cancelling
// ctx abandons a call; a write already sent may have applied
// (ErrAmbiguousCommit).
//
// A Holds holds no state but its clock: it is safe for concurrent
// use if the clock is, and starts no goroutines.
type Holds struct {
	client DynamoDBAPI
	table  string
	keys   keyAttrs
	clock  func() time.Time
	retry  retrier
	obs    observe.Observer
	intN   func(int) int // HoldAny's shuffle
}

// Attribute names of a Holds item, beside its key attributes.
const (
	// HoldStateAttr holds a resource's state, the string "free",
	// "held" or "confirmed".
	HoldStateAttr = "state"
	// HolderAttr holds the holder of a held or confirmed resource.
	HolderAttr = "holder"
	// HoldUntilAttr holds a held resource's end: a number, Unix
	// milliseconds on the clock of the caller that held it.
	HoldUntilAttr = "hold_until"
)

// MaxHoldAll bounds HoldAll's resources: a DynamoDB transaction
// holds at most 100 actions.
const MaxHoldAll = 100

// The values of HoldStateAttr.
const (
	holdFree      = "free"
	holdHeld      = "held"
	holdConfirmed = "confirmed"
)

// WithClock sets the clock that holds' ends are set from and
// judged by (default time.Now). Every Holds on a table should read a
// synchronised clock: see Holds.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.used.Add(setClock); c.clock = now }
}

// NewHolds returns a Holds on table, whose partition key is a string
// attribute named "pk" unless WithKeyAttributes says otherwise. client is
// usually a *dynamodb.Client.
func NewHolds(client DynamoDBAPI, table string, opts ...Option) (*Holds, error) {
	cfg := config{keys: defaultKeys, clock: time.Now}
	if err := apply(&cfg, opts, "NewHolds", holdsSetters); err != nil {
		return nil, err
	}
	if ddbarg.NilClient(client) {
		return nil, condcore.Invalid("client is nil")
	}
	if err := validTable("table", table); err != nil {
		return nil, err
	}
	if err := cfg.keys.valid(HoldStateAttr, HolderAttr, HoldUntilAttr); err != nil {
		return nil, err
	}
	if cfg.clock == nil {
		return nil, condcore.Invalid("clock is nil")
	}
	return &Holds{
		client: client, table: table, keys: cfg.keys, clock: cfg.clock, retry: newRetrier(cfg.log), obs: cfg.obs, intN: rand.IntN,
	}, nil
}

func (h *Holds) key(resource string) map[string]types.AttributeValue {
	return h.keys.item(resource)
}

// Add creates free resources, one conditional write each in sorted order;
// those that exist already are left as they are, so Add is idempotent. It
// is not atomic: on an error, the resources sorted before the one it names
// exist, and a retry is safe. Add with no resources does nothing.
func (h *Holds) Add(ctx context.Context, resources ...string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := condcore.ValidArgs("resources", resources); err != nil {
		return err
	}
	if len(resources) > 0 {
		if err := condcore.Unsent(ctx, "add resources"); err != nil {
			return err
		}
	}
	for _, r := range slices.Compact(slices.Sorted(slices.Values(resources))) {
		_, err := h.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
			TableName:                 aws.String(h.table),
			Key:                       h.key(r),
			UpdateExpression:          aws.String("SET #s = :free"),
			ConditionExpression:       aws.String("attribute_not_exists(#k)"),
			ExpressionAttributeNames:  map[string]string{"#k": h.keys.pk, "#s": HoldStateAttr},
			ExpressionAttributeValues: map[string]types.AttributeValue{":free": strAttr(holdFree)},
		}, ddberr.NoBlindRetries)
		if _, exists := ddberr.ConditionFailed(err); err != nil && !exists {
			return errfmt.Errorf("conditional: add %q: %w", r, writeErr(err))
		}
	}
	return nil
}

// Hold holds resource for holder until ttl from now by this Holds'
// clock, and returns that end (rounded down to whole milliseconds, as
// stored; compare it only with the same clock). It succeeds when the
// resource is free, when its hold has expired by this clock, or when
// holder holds it already: then the hold is reset to end ttl from now
// (which may shorten it), so a retried Hold is idempotent. Otherwise it
// returns a *HoldError wrapping ErrHeld (another holder's hold has not
// expired), ErrConfirmed or ErrNotFound (no such resource; see Add), and
// nothing changed.
//
// The reason for a refusal is the item the server judged, where it returns
// it, else a strongly consistent read just after: then a resource freed in
// between reports ErrHeld; either way it was not yours. ErrAmbiguousCommit
// means the write was sent and its answer lost: retry (Hold is
// idempotent). A write that meets a transaction in progress on the item is
// retried with backoff, then ErrConflict; nothing changed.
func (h *Holds) Hold(ctx context.Context, resource, holder string, ttl time.Duration) (until time.Time, err error) {
	return condcore.Observed(ctx, h.obs, condcore.Hold, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) (time.Time, error) {
		return h.hold(ctx, resource, holder, ttl)
	})
}

func (h *Holds) hold(ctx context.Context, resource, holder string, ttl time.Duration) (time.Time, error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return time.Time{}, err
	}
	if err := validHolder(resource, holder); err != nil {
		return time.Time{}, err
	}
	if err := validTTL(ttl); err != nil {
		return time.Time{}, err
	}
	if err := condcore.Unsent(ctx, fmt.Sprintf("hold %q", resource)); err != nil {
		return time.Time{}, err
	}
	var end int64
	item, refused, err := h.write(ctx, resource, func(now int64) *types.Update {
		end = now + ttl.Milliseconds()
		return h.holdUpdate(resource, holder, now, end)
	})
	switch {
	case err != nil:
		return time.Time{}, errfmt.Errorf("conditional: hold %q: %w", resource, err)
	case refused:
		return time.Time{}, &HoldError{Resource: resource, Err: holdRefusal(item)}
	}
	return time.UnixMilli(end), nil
}

// HoldAll holds every one of resources for holder, or none of them, in one
// TransactWriteItems with Hold's rule per resource and one end for all,
// which it returns. When any resource cannot be held it returns a
// *HoldError naming it (an unknown resource if the server reports one,
// else the first refused in sorted order) and nothing was held or changed.
//
// At most MaxHoldAll resources; duplicate or empty entries are
// ErrInvalid; the slice is not modified. HoldAll is idempotent like Hold;
// ErrAmbiguousCommit means the outcome is unknown. A transaction cancelled
// only by others in progress on its items is retried with backoff, then
// ErrConflict. On a server without transactions (dynalite) it fails with
// an error wrapping errors.ErrUnsupported.
func (h *Holds) HoldAll(ctx context.Context, resources []string, holder string, ttl time.Duration) (until time.Time, err error) {
	e := observe.Event{Key: condcore.HoldAllKey(h.obs, resources), N: int64(len(resources))}
	return condcore.Observed(ctx, h.obs, condcore.HoldAll, true, e, func(ctx context.Context) (time.Time, error) {
		return h.holdAll(ctx, resources, holder, ttl)
	})
}

func (h *Holds) holdAll(ctx context.Context, resources []string, holder string, ttl time.Duration) (time.Time, error) {
	if err := condcore.CheckCtx(ctx); err != nil {
		return time.Time{}, err
	}
	if len(resources) == 0 {
		return time.Time{}, condcore.Invalid("resources is empty")
	}
	if len(resources) > MaxHoldAll {
		return time.Time{}, condcore.Invalid("resources has %d entries, more than %d", len(resources), MaxHoldAll)
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
	sorted := slices.Sorted(slices.Values(resources))
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return time.Time{}, condcore.Invalid("resources has %q twice", sorted[i])
		}
	}

	if err := condcore.Unsent(ctx, fmt.Sprintf("hold %d resources", len(sorted))); err != nil {
		return time.Time{}, err
	}
	var end int64
	err := h.retryConflicts(ctx, strings.Join(sorted, ","), func(ctx context.Context) error {
		now := h.clock().UnixMilli()
		end = now + ttl.Milliseconds()
		items := make([]types.TransactWriteItem, len(sorted))
		for i, r := range sorted {
			items[i] = types.TransactWriteItem{Update: h.holdUpdate(r, holder, now, end)}
		}
		_, err := h.client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items}, ddberr.NoBlindRetries)
		if err != nil {
			return writeErr(err)
		}
		return nil
	})
	if err == nil {
		return time.UnixMilli(end), nil
	}
	if unsupported(err) {
		return time.Time{}, errfmt.Errorf("conditional: hold %d resources needs TransactWriteItems: %w: %w", len(sorted), errors.ErrUnsupported, err)
	}
	refusal, rerr := h.refusal(ctx, err, sorted)
	switch {
	case rerr != nil:
		return time.Time{}, errfmt.Errorf("conditional: hold %d resources refused; reading why: %w", len(sorted), rerr)
	case refusal != nil:
		return time.Time{}, refusal
	}
	return time.Time{}, errfmt.Errorf("conditional: hold %d resources: %w", len(sorted), err)
}

// Confirm makes holder's hold on resource final: the resource stays
// holder's and is never held again. It succeeds only while the hold has
// not expired by this Holds' clock; confirming again what holder
// confirmed already succeeds, so a retried Confirm is safe. Otherwise it
// returns ErrNotHolder (free, held by another, confirmed by another, or
// holder's hold expired, even if no one has taken it since) or
// ErrNotFound, and nothing changed. To confirm together with your own
// writes, use ConfirmItem.
func (h *Holds) Confirm(ctx context.Context, resource, holder string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := validHolder(resource, holder); err != nil {
		return err
	}
	return condcore.ObservedErr(ctx, h.obs, condcore.Confirm, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) error {
		return h.settle(ctx, "confirm", resource, func(now int64) *types.Update { return h.confirmUpdate(resource, holder, now) })
	})
}

// Release frees resource if holder holds it, expired or not. Otherwise it
// returns ErrNotHolder (free, held by another, or confirmed) or
// ErrNotFound, and nothing changed. A retried Release whose first
// attempt freed the resource returns ErrNotHolder: either way holder does
// not hold it.
func (h *Holds) Release(ctx context.Context, resource, holder string) error {
	if err := condcore.CheckCtx(ctx); err != nil {
		return err
	}
	if err := validHolder(resource, holder); err != nil {
		return err
	}
	return condcore.ObservedErr(ctx, h.obs, condcore.Release, true, observe.Event{Key: resource, N: 1}, func(ctx context.Context) error {
		return h.settle(ctx, "release", resource, func(int64) *types.Update { return h.releaseUpdate(resource, holder) })
	})
}

// ConfirmItem returns Confirm's write as an action for your own
// TransactWriteItems (the order, the payment), so the confirmation applies
// with your other writes or not at all. Expiry is judged by the clock's
// reading when ConfirmItem is called: build the item just before sending
// it. A refusal shows as a TransactionCanceledException in which
// ConditionFailedAt reports this action (with the item, where the server
// returns it). Bad input is ErrInvalid.
func (h *Holds) ConfirmItem(resource, holder string) (types.TransactWriteItem, error) {
	if err := validHolder(resource, holder); err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: h.confirmUpdate(resource, holder, h.clock().UnixMilli())}, nil
}

// ReleaseItem returns Release's write as an action for your own
// TransactWriteItems (cancelling an order frees its seat). A refusal shows
// as a TransactionCanceledException in which ConditionFailedAt reports
// this action. Bad input is ErrInvalid.
func (h *Holds) ReleaseItem(resource, holder string) (types.TransactWriteItem, error) {
	if err := validHolder(resource, holder); err != nil {
		return types.TransactWriteItem{}, err
	}
	return types.TransactWriteItem{Update: h.releaseUpdate(resource, holder)}, nil
}
