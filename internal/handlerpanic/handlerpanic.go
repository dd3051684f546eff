// Package handlerpanic is the panic of a user's message handler, recovered
// so that one poison message is parked instead of crashing the process;
// inbox and partition export it as PanicError.
package handlerpanic

import (
	"fmt"
	"runtime/debug"
)

// Error is a handler's panic that was recovered: the message counts as
// failed (and is parked after the attempts), the process lives on.
type Error struct {
	Value any    // what the handler panicked with
	Stack []byte // the handler's goroutine's stack at the panic
	pkg   string // the package that recovered it, for the message
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: handler panicked: %v\n%s", e.pkg, e.Value, e.Stack)
}

// Recover, deferred by the function that calls a handler, turns the
// handler's panic into an *Error in *err, its message prefixed with pkg.
func Recover(pkg string, err *error) {
	if v := recover(); v != nil {
		*err = &Error{Value: v, Stack: debug.Stack(), pkg: pkg}
	}
}
