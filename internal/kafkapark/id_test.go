package kafkapark

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in string
		id ID
		ok bool
	}{
		{"orders/3@17", ID{"orders", 3, 17}, true},
		{"a/b/0@0", ID{"a/b", 0, 0}, true},
		{"a@b/1@2", ID{"a@b", 1, 2}, true},
		{"orders/3/17", ID{}, false},
		{"orders@17", ID{}, false},
		{"/3@17", ID{}, false},
		{"orders/-1@17", ID{}, false},
		{"orders/1@-17", ID{}, false},
		{"orders/+1@17", ID{}, false},
		{"orders/01@17", ID{}, false},
		{"orders/1@x", ID{}, false},
		{"orders/99999999999@1", ID{}, false},
		{"", ID{}, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			id, err := Parse(tc.in)
			if (err == nil) != tc.ok || id != tc.id {
				t.Fatalf("Parse(%q) = %v, %v; want %v, ok %v", tc.in, id, err, tc.id, tc.ok)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add("orders/3@17")
	f.Add("a/b@c/1@2")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		if id.String() != s {
			t.Fatalf("Parse(%q) = %v, which prints as %q", s, id, id.String())
		}
		if again, err := Parse(id.String()); err != nil || again != id {
			t.Fatalf("round trip of %v: %v, %v", id, again, err)
		}
	})
}

func TestIndexName(t *testing.T) {
	long := strings.Repeat("é", 31) + "_parked" // 69 bytes
	for _, tc := range []struct{ table, want string }{
		{"nolock_inbox_parked", "nolock_inbox_parked_at"},
		{strings.Repeat("a", 60), strings.Repeat("a", 60) + "_at"},
	} {
		if got := indexName(tc.table); got != tc.want {
			t.Errorf("indexName(%q) = %q, want %q", tc.table, got, tc.want)
		}
	}
	a, b := indexName(strings.Repeat("a", 61)), indexName(strings.Repeat("a", 62))
	for _, name := range []string{a, b, indexName(long)} {
		if len(name) > 63 || !utf8.ValidString(name) {
			t.Errorf("indexName gave %q: %d bytes, or not UTF-8", name, len(name))
		}
	}
	if a == b {
		t.Errorf("two long tables share the index name %q", a)
	}
}
