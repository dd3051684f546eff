package option

import (
	"math/bits"
	"strings"

	"github.com/nolock/nolock/internal/errfmt"
)

// Used is the set of setters applied to a settings struct that several
// constructors of a package share (one Option type per package), so that
// each constructor can refuse a setter that does not apply to it. The
// package numbers its setters: setter i of its list of names is bit 1<<i.
// Recording a setter allocates nothing, so a call that takes its options
// on every call (cas.Retry) pays nothing for the check.
type Used uint64

// Add records that the setters s were applied.
func (u *Used) Add(s Used) { *u |= s }

// Check returns an error naming the first recorded setter (in the order
// of names, the package's setter names by bit) that is not in allowed and
// the constructor ctor that was given it ("WithBuckets does not apply to
// NewHolds, which takes WithTable, WithObserver"), for the caller to wrap
// in its package's invalid-argument error.
func (u Used) Check(names []string, ctor string, allowed Used) error {
	bad := u &^ allowed
	if bad == 0 {
		return nil
	}
	s := names[bits.TrailingZeros64(uint64(bad))]
	var takes []string
	for i, n := range names {
		if allowed&(1<<i) != 0 {
			takes = append(takes, n)
		}
	}
	if len(takes) == 0 {
		return errfmt.Errorf("%s does not apply to %s, which takes no option", s, ctor)
	}
	return errfmt.Errorf("%s does not apply to %s, which takes %s", s, ctor, strings.Join(takes, ", "))
}

// ApplyTo applies opts to cfg, whose setters record their bits in used,
// and returns an error naming a nil option or the first setter that ctor,
// which takes allowed, does not take (names: the setters' names by bit).
func ApplyTo[O ~func(*C), C any](cfg *C, used *Used, opts []O, names []string, ctor string, allowed Used) error {
	if err := Apply(opts, func(o O) { o(cfg) }); err != nil {
		return err
	}
	return used.Check(names, ctor, allowed)
}
