package conditional_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/observe"
)

// noIO is a DB whose every call panics (its DB is nil): the constructors
// judge their options before any I/O.
type noIO struct{ conditional.DB }

// A setter given to a constructor it does not apply to is refused with
// ErrInvalid naming the setter and the constructor, before any I/O; the
// setters that apply are taken.
func TestOptionsApplyOnlyWhereListed(t *testing.T) {
	t.Parallel()
	db := noIO{}
	var obs observe.Observer = observe.Func(func(context.Context, observe.Event) {})
	for _, tc := range []struct {
		name, want string // want: "" to accept, else the setter and constructor named
		err        error
	}{
		{"NewHolds with WithBuckets", "WithBuckets does not apply to NewHolds", nilErr(conditional.NewHolds(db, conditional.WithTable("h"), conditional.WithBuckets(2)))},
		{"NewHolds with WithLogger", "WithLogger does not apply to NewHolds", nilErr(conditional.NewHolds(db, conditional.WithLogger(nil)))},
		{"NewFenced with WithTable", "WithTable does not apply to NewFenced", nilErr(conditional.NewFenced("t", "k", "f", conditional.WithTable("x")))},
		{"NewFenced with WithSoldOutCache", "WithSoldOutCache does not apply to NewFenced", nilErr(conditional.NewFenced("t", "k", "f", conditional.WithObserver(obs), conditional.WithSoldOutCache(1)))},
		{"NewFenced with WithObserver", "", nilErr(conditional.NewFenced("t", "k", "f", conditional.WithObserver(obs)))},
		{"NewHolds with WithTable and WithObserver", "", nilErr(conditional.NewHolds(db, conditional.WithTable("h"), conditional.WithObserver(obs)))},
		{"nil option", "option 1 is nil", nilErr(conditional.NewFenced("t", "k", "f", conditional.WithObserver(obs), nil))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.want == "" && tc.err != nil:
				t.Fatalf("refused: %v", tc.err)
			case tc.want != "" && (!errors.Is(tc.err, conditional.ErrInvalid) || !strings.Contains(tc.err.Error(), tc.want)):
				t.Fatalf("got %v; want ErrInvalid naming %q", tc.err, tc.want)
			}
		})
	}
}

// nilErr drops a constructor's value, keeping its error.
func nilErr[T any](_ T, err error) error { return err }
