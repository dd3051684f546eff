// Package handlerpanic recovers the panic of a user's message handler, so
// that one poison message is parked instead of crashing the process; inbox
// and partition each turn it into their own PanicError.
package handlerpanic

import "runtime/debug"

// Recover, deferred by the function that calls a handler, sets *err to
// wrap(value, stack) when the handler panicked with value.
func Recover(err *error, wrap func(value any, stack []byte) error) {
	if v := recover(); v != nil {
		*err = wrap(v, debug.Stack())
	}
}
