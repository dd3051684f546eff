package testenv

import (
	"io"
	"os"
	"testing"
)

// Printed runs f, an Example function, and returns what it wrote to
// os.Stdout, so that a test can run an Example against the test services
// and compare its output. os.Stdout is restored even when f skips or
// fails the test.
func Printed(t testing.TB, f func()) (s string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() { b, _ := io.ReadAll(r); out <- string(b) }()
	defer func() {
		os.Stdout = stdout
		_ = w.Close()
		s = <-out
		_ = r.Close()
	}()
	f()
	return ""
}
