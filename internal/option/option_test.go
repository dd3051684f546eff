package option

import (
	"strings"
	"testing"
)

type fn func(*int)

type iface interface{ apply(*int) }

func (f fn) apply(n *int) { f(n) }

func TestApply(t *testing.T) {
	add := fn(func(n *int) { *n++ })
	var n int
	if err := Apply([]fn{add, add}, func(o fn) { o(&n) }); err != nil || n != 2 {
		t.Fatalf("Apply = %v, n = %d; want nil, 2", err, n)
	}
	for name, err := range map[string]error{
		"nil func":                Apply([]fn{add, nil}, func(o fn) { o(&n) }),
		"nil interface":           Apply([]iface{add, nil}, func(o iface) { o.apply(&n) }),
		"interface with nil func": Apply([]iface{add, fn(nil)}, func(o iface) { o.apply(&n) }),
	} {
		if err == nil || !strings.Contains(err.Error(), "option 1 is nil") {
			t.Errorf("%s: %v; want option 1 is nil", name, err)
		}
	}
}

func TestUsedCheck(t *testing.T) {
	const (
		withTable Used = 1 << iota
		withObserver
		withBuckets
	)
	names := []string{"WithTable", "WithObserver", "WithBuckets"}
	var u Used
	u.Add(withTable)
	if err := u.Check(names, "NewHolds", withTable|withObserver); err != nil {
		t.Fatalf("allowed setter: %v", err)
	}
	u.Add(withBuckets)
	err := u.Check(names, "NewHolds", withTable|withObserver)
	if err == nil || err.Error() != "WithBuckets does not apply to NewHolds, which takes WithTable, WithObserver" {
		t.Fatalf("Check = %v", err)
	}
	if err := u.Check(names, "NewFenced", 0); err == nil || err.Error() != "WithTable does not apply to NewFenced, which takes no option" {
		t.Fatalf("Check with nothing allowed = %v", err)
	}
}
