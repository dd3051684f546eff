package dynamoconditional

import (
	"strings"
	"testing"
)

func TestAddSet(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "SET #f = :t"},
		{"SET #a = :a", "SET #f = :t, #a = :a"},
		{"set #a = :a", "set #f = :t, #a = :a"},
		{"REMOVE #x", "REMOVE #x SET #f = :t"},
		{"ADD #set :one", "ADD #set :one SET #f = :t"},
		{"REMOVE #x SET #a = if_not_exists(#a, :set)", "REMOVE #x SET #f = :t, #a = if_not_exists(#a, :set)"},
	} {
		if got := addSet(tc.in, "#f = :t"); got != tc.want {
			t.Errorf("addSet(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// addSet puts the assignment into the one SET clause, or adds one, and
// never loses the caller's text.
func FuzzAddSet(f *testing.F) {
	for _, s := range []string{"", "SET a = :a", "REMOVE #x", "ADD #set :one", "set #a = if_not_exists(#a, :set) REMOVE b", "(SET)", "#SET"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		out := addSet(expr, "#nolockFence = :nolockToken")
		if !strings.Contains(out, "#nolockFence = :nolockToken") {
			t.Fatalf("assignment missing: %q", out)
		}
		if strings.Replace(out, " #nolockFence = :nolockToken,", "", 1) != expr &&
			out != expr+" SET #nolockFence = :nolockToken" && out != "SET #nolockFence = :nolockToken" {
			t.Fatalf("addSet(%q) = %q changes the caller's text", expr, out)
		}
	})
}
