package testenv

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// WaitParked waits until at least n of the goroutines that the calling
// goroutine started are parked (waiting on a channel, a select, a lock;
// not running, runnable, in a system call or assisting the GC) with fn
// as their innermost frame outside the runtime. fn is a function's name
// as a stack trace prints it, or its tail:
// "internal/combine.(*Combiner[...]).Do" for calls queued in a combiner
// behind the operation in flight. It is the probe for "this many calls
// have arrived and wait", where the code under test exposes no count;
// counting only the caller's own goroutines keeps tests that run in
// parallel out of it.
func WaitParked(t testing.TB, n int, fn string) {
	t.Helper()
	me := goroutineID()
	Until(t, strconv.Itoa(n)+" goroutines parked in "+fn, func() (bool, error) {
		return parked(me, fn) >= n, nil
	})
}

// Parked returns how many of the goroutines that the calling goroutine
// started are parked in fn now (see WaitParked).
func Parked(fn string) int { return parked(goroutineID(), fn) }

// goroutineID returns the calling goroutine's number, as stack traces
// print it.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

// parked counts the goroutines started by goroutine parent that are parked
// in fn.
func parked(parent, fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if parkedIn(string(g), parent, fn) {
			count++
		}
	}
	return count
}

// blocked holds the wait reasons of a goroutine blocked until another
// goroutine acts. Other states are passing: running, runnable, a system
// call, or a GC assist wait, which can hold a goroutine inside fn's
// allocation before it reaches the wait the caller probes for.
var blocked = map[string]bool{
	"chan receive": true, "chan send": true, "select": true,
	"chan receive (nil chan)": true, "chan send (nil chan)": true, "select (no cases)": true,
	"sync.Cond.Wait": true, "sync.Mutex.Lock": true, "sync.RWMutex.Lock": true,
	"sync.RWMutex.RLock": true, "sync.WaitGroup.Wait": true, "semacquire": true,
}

// parkedIn reports whether the goroutine whose trace is g was started by
// goroutine parent and is parked with fn as its innermost frame outside
// the runtime. A trace is a header, "goroutine 7 [chan receive, 2
// minutes]:", then per frame a line naming the function and an indented
// line with its file, and last "created by f in goroutine 6" and its file.
func parkedIn(g, parent, fn string) bool {
	lines := strings.Split(g, "\n")
	state, ok := strings.CutPrefix(lines[0], "goroutine ")
	if !ok {
		return false
	}
	if i := strings.IndexByte(state, '['); i >= 0 {
		state = state[i+1:]
	}
	state, _, _ = strings.Cut(state, "]")
	state, _, _ = strings.Cut(state, ",")
	if !blocked[state] {
		return false
	}
	inFn := false
	for _, l := range lines[1:] {
		if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") {
			continue
		}
		if by, ok := strings.CutPrefix(l, "created by "); ok {
			return inFn && strings.HasSuffix(by, " in goroutine "+parent)
		}
		if !inFn {
			name := l
			if i := strings.LastIndexByte(l, '('); i > 0 {
				name = l[:i]
			}
			if !strings.HasSuffix(name, fn) {
				return false
			}
			inFn = true
		}
	}
	return false
}
