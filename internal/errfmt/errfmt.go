// Package errfmt builds nolock's wrapped errors so that each message names
// its package once: "cas: update "k": gave up after 3 attempts: version
// conflict", never "...: cas: version conflict".
package errfmt

import (
	"fmt"
	"strings"
)

// Errorf is fmt.Errorf whose message keeps its leading package prefix
// ("cas: ") once: each later occurrence of that prefix right after a ": "
// is dropped. The error wraps exactly what fmt.Errorf's would, so
// errors.Is and errors.As see the same chain.
func Errorf(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	msg := err.Error()
	prefix, ok := leadingPrefix(msg)
	if !ok {
		return err
	}
	rest := strings.ReplaceAll(msg[len(prefix):], ": "+prefix, ": ")
	rest = strings.TrimPrefix(rest, prefix) // "cas: %w" around "cas: x"
	if len(prefix)+len(rest) == len(msg) {
		return err
	}
	return &deduped{msg: prefix + rest, err: err}
}

// leadingPrefix returns msg's "pkg: " or "pkg/sub: " prefix: lower-case
// letters, digits and slashes before the first ": ".
func leadingPrefix(msg string) (string, bool) {
	i := strings.Index(msg, ": ")
	if i <= 0 {
		return "", false
	}
	for _, c := range msg[:i] {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '/') {
			return "", false
		}
	}
	return msg[:i+2], true
}

// deduped is fmt.Errorf's error with a shorter message.
type deduped struct {
	msg string
	err error
}

func (e *deduped) Error() string { return e.msg }

// Unwrap returns what the fmt.Errorf error wraps: one error or several.
func (e *deduped) Unwrap() []error {
	switch u := e.err.(type) {
	case interface{ Unwrap() []error }:
		return u.Unwrap()
	case interface{ Unwrap() error }:
		return []error{u.Unwrap()}
	}
	return nil
}
