// Package option applies the functional options of nolock's constructors
// and calls, refusing nil ones before any is judged or any I/O is done.
package option

import (
	"reflect"

	"github.com/nolock/nolock/internal/errfmt"
)

// Apply calls apply with each of opts in order. It stops at the first nil
// option (a nil func, or an interface holding none or a nil func) and
// returns an error naming its index ("option 2 is nil"), for the caller to
// wrap in its package's invalid-argument error.
func Apply[O any](opts []O, apply func(O)) error {
	for i, o := range opts {
		if isNil(o) {
			return errfmt.Errorf("option %d is nil", i)
		}
		apply(o)
	}
	return nil
}

// isNil reports whether o is nil or holds a nil func.
func isNil(o any) bool {
	if o == nil {
		return true
	}
	v := reflect.ValueOf(o)
	return v.Kind() == reflect.Func && v.IsNil()
}
