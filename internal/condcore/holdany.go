package condcore

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/observe"
)

// MaxResources bounds the resources of one Free or HoldAny call, on
// either backend.
const MaxResources = 100

// Status is one resource's state as a read saw it. Holder is "" when the
// resource is free (a hold past its end counts as free); Until is set only
// for a hold that had not ended; Confirmed means Holder has it for good.
type Status struct {
	Holder    string
	Until     time.Time
	Confirmed bool
}

// ValidSet checks the resources of a call that takes a set of them (Free,
// HoldAny): 1 to MaxResources entries, each a valid name, none twice. It
// returns them sorted, in a new slice.
func ValidSet(resources []string) ([]string, error) {
	if len(resources) == 0 {
		return nil, Invalid("resources is empty")
	}
	if len(resources) > MaxResources {
		return nil, Invalid("resources has %d entries, more than %d", len(resources), MaxResources)
	}
	if err := ValidArgs("resources", resources); err != nil {
		return nil, err
	}
	sorted := slices.Sorted(slices.Values(resources))
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, Invalid("resources has %q twice", sorted[i])
		}
	}
	return sorted, nil
}

// Missing returns the first of sorted that read has no status for, or "".
func Missing(sorted []string, read map[string]Status) string {
	for _, r := range sorted {
		if _, ok := read[r]; !ok {
			return r
		}
	}
	return ""
}

// Reader returns the status of each of sorted that exists, by the
// store's clock.
type Reader func(ctx context.Context, sorted []string) (map[string]Status, error)

// Get is both backends' Holds.Get: resource's status, or ErrNotFound.
func Get(ctx context.Context, resource string, read Reader) (Status, error) {
	if err := CheckCtx(ctx); err != nil {
		return Status{}, err
	}
	if err := ValidArg("resource", resource); err != nil {
		return Status{}, err
	}
	got, err := read(ctx, []string{resource})
	if err != nil {
		return Status{}, errfmt.Errorf("conditional: get %q: %w", resource, err)
	}
	s, ok := got[resource]
	if !ok {
		return Status{}, errfmt.Errorf("conditional: get %q: %w", resource, ErrNotFound)
	}
	return s, nil
}

// Free is both backends' Holds.Free: those of resources (valid, see
// ValidSet) that are free, in the order given.
func Free(ctx context.Context, resources []string, read Reader) ([]string, error) {
	if err := CheckCtx(ctx); err != nil {
		return nil, err
	}
	sorted, err := ValidSet(resources)
	if err != nil {
		return nil, err
	}
	got, err := read(ctx, sorted)
	if err != nil {
		return nil, errfmt.Errorf("conditional: free of %d resources: %w", len(sorted), err)
	}
	if r := Missing(sorted, got); r != "" {
		return nil, errfmt.Errorf("conditional: free of %d resources: %q: %w", len(sorted), r, ErrNotFound)
	}
	var free []string
	for _, r := range resources {
		if got[r].Holder == "" {
			free = append(free, r)
		}
	}
	return free, nil
}

// AnyOf is what HoldAny needs from a backend.
type AnyOf struct {
	Read Reader
	// ValidTTL checks the backend's ttl argument.
	ValidTTL func() error
	// Hold is the backend's Hold for one resource, unobserved.
	Hold func(ctx context.Context, resource string) (time.Time, error)
	// Refuse returns the package's *HoldError for resource and reason.
	Refuse func(resource string, reason error) error
	// IntN returns a random int in [0, n), safe for concurrent use.
	IntN func(n int) int
	Obs  observe.Observer
}

// HoldAny is both backends' Holds.HoldAny. After checking its arguments
// (resources: see ValidSet) it reads the set, then holds holder's own
// current hold among them if there is one (a retry of a HoldAny that
// succeeded), else a free one picked at random; when another caller took
// that one first, it reads those that were free again and tries one still
// free, until one is held or none is left. Each attempt is the backend's
// one conditional Hold, so a resource never has two holders and a refused
// attempt changed nothing. It reports one event to a.Obs, as Hold does:
// held (Key the resource held), refused or failed (bad input included;
// Key the resources, sorted, joined by ",").
func HoldAny(ctx context.Context, resources []string, holder string, a AnyOf) (resource string, until time.Time, err error) {
	var sp observed.Span
	if a.Obs != nil {
		ctx, sp = observed.Start(a.Obs, ctx, observe.Call{Name: anyHold.Call, Key: HoldAllKey(a.Obs, resources)})
	}
	start := time.Now()
	resource, until, err = checkedHoldAny(ctx, resources, holder, a)
	if sp.On() {
		e := observe.Event{Name: anyHold.name(err), Key: resource, N: 1, Err: err, Duration: time.Since(start)}
		if err != nil {
			e.Key = HoldAllKey(a.Obs, resources)
		}
		sp.End(e)
	}
	return resource, until, err
}

func checkedHoldAny(ctx context.Context, resources []string, holder string, a AnyOf) (string, time.Time, error) {
	if err := CheckCtx(ctx); err != nil {
		return "", time.Time{}, err
	}
	sorted, err := ValidSet(resources)
	if err != nil {
		return "", time.Time{}, err
	}
	if err := ValidArg("holder", holder); err != nil {
		return "", time.Time{}, err
	}
	if err := a.ValidTTL(); err != nil {
		return "", time.Time{}, err
	}
	return holdAny(ctx, sorted, holder, a)
}

func holdAny(ctx context.Context, sorted []string, holder string, a AnyOf) (string, time.Time, error) {
	held := map[string]bool{} // held by another, as read or as a refused attempt found
	for left := sorted; len(left) > 0; {
		read, err := a.Read(ctx, left)
		if err != nil {
			return "", time.Time{}, errfmt.Errorf("conditional: hold any of %d resources: %w", len(sorted), err)
		}
		if len(left) == len(sorted) { // the first read: every resource must exist
			if r := Missing(sorted, read); r != "" {
				return "", time.Time{}, a.Refuse(r, ErrNotFound)
			}
		}
		free := candidates(left, read, holder, held, a.IntN)
		if len(free) == 0 {
			break
		}
		until, err := a.Hold(ctx, free[0])
		switch {
		case err == nil:
			return free[0], until, nil
		case errors.Is(err, ErrHeld):
			held[free[0]] = true
		case !errors.Is(err, ErrConfirmed):
			return "", time.Time{}, err
		}
		left = slices.Sorted(slices.Values(free[1:]))
	}
	for _, r := range sorted {
		if held[r] {
			return "", time.Time{}, a.Refuse(r, ErrHeld)
		}
	}
	return "", time.Time{}, a.Refuse(sorted[0], ErrConfirmed)
}

// candidates returns those of left that read found holder could hold: a
// current hold of holder's own first (holding a second resource would
// leave it held), then the free ones in random order, so concurrent
// callers spread over them instead of racing for one. It marks in held
// those held by another.
func candidates(left []string, read map[string]Status, holder string, held map[string]bool, intN func(int) int) []string {
	var own, free []string
	for _, r := range left {
		s, ok := read[r]
		switch {
		case !ok || s.Confirmed:
		case s.Holder == "":
			free = append(free, r)
		case s.Holder == holder:
			own = append(own, r)
		default:
			held[r] = true
		}
	}
	for i := len(free) - 1; i > 0; i-- {
		j := intN(i + 1)
		free[i], free[j] = free[j], free[i]
	}
	return append(own, free...)
}
