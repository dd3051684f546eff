package option

import (
	"slices"
	"strings"

	"github.com/nolock/nolock/internal/errfmt"
)

// Used records the setters applied to a settings struct that several
// constructors of a package share (one Option type per package), so that
// each constructor can refuse a setter that does not apply to it.
type Used []string

// Add records that setter (its name, "WithBuckets") was applied.
func (u *Used) Add(setter string) { *u = append(*u, setter) }

// Check returns an error naming the first recorded setter that is not one
// of allowed and the constructor ctor that was given it ("WithBuckets
// does not apply to NewHolds, which takes WithTable, WithObserver"), for
// the caller to wrap in its package's invalid-argument error.
func (u Used) Check(ctor string, allowed ...string) error {
	for _, s := range u {
		if !slices.Contains(allowed, s) {
			if len(allowed) == 0 {
				return errfmt.Errorf("%s does not apply to %s, which takes no option", s, ctor)
			}
			return errfmt.Errorf("%s does not apply to %s, which takes %s", s, ctor, strings.Join(allowed, ", "))
		}
	}
	return nil
}

// ApplyTo applies opts to cfg, whose setters record their names in used,
// and returns an error naming a nil option or the first setter that ctor,
// which takes allowed, does not take.
func ApplyTo[O ~func(*C), C any](cfg *C, used *Used, opts []O, ctor string, allowed []string) error {
	if err := Apply(opts, func(o O) { o(cfg) }); err != nil {
		return err
	}
	return used.Check(ctor, allowed...)
}
