package condcore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzValidArg checks the key validator against its definition: a key is
// valid iff it is non-empty, at most MaxKeyLen bytes, valid UTF-8 and free of NUL bytes;
// an invalid one yields ErrInvalid naming the argument.
func FuzzValidArg(f *testing.F) {
	for _, seed := range []string{"", "sku", "a\x00b", strings.Repeat("k", MaxKeyLen), strings.Repeat("k", MaxKeyLen+1), "ü", "sku-\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		err := ValidArg("holder", v)
		want := v != "" && len(v) <= MaxKeyLen && !strings.ContainsRune(v, 0) && utf8.ValidString(v)
		if (err == nil) != want {
			t.Fatalf("ValidArg(%q) = %v, want valid=%v", v, err, want)
		}
		if err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "holder")) {
			t.Fatalf("ValidArg(%q) = %v: want ErrInvalid naming the argument", v, err)
		}
	})
}

// FuzzValidSet checks the set validator against its definition: 1 to
// MaxResources entries, each a valid name, none twice; a valid set comes
// back sorted, its argument untouched, and an invalid one yields
// ErrInvalid. The names are joined's ","-separated parts, plus pad
// distinct fillers to reach past the bound.
func FuzzValidSet(f *testing.F) {
	f.Add("b,a,c", uint8(0))
	f.Add("a,a", uint8(0))
	f.Add("", uint8(0))
	f.Add("a,", uint8(0))
	f.Add("a", uint8(MaxResources))
	f.Add("a", uint8(MaxResources-1))
	f.Add("\xff", uint8(1))
	f.Fuzz(func(t *testing.T, joined string, pad uint8) {
		var rs []string
		if joined != "" {
			rs = strings.Split(joined, ",")
		}
		for i := range int(pad) {
			rs = append(rs, fmt.Sprintf("filler-%03d", i))
		}
		in := slices.Clone(rs)
		sorted, err := ValidSet(rs)
		want := len(rs) >= 1 && len(rs) <= MaxResources
		seen := map[string]bool{}
		for _, r := range rs {
			want = want && ValidArg("r", r) == nil && !seen[r]
			seen[r] = true
		}
		if (err == nil) != want {
			t.Fatalf("ValidSet(%q) = %v, want valid=%v", rs, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("ValidSet(%q) = %v: want ErrInvalid", rs, err)
		}
		if !slices.Equal(rs, in) {
			t.Fatalf("ValidSet modified its argument: %q, was %q", rs, in)
		}
		if err == nil && (!slices.IsSorted(sorted) || len(sorted) != len(rs)) {
			t.Fatalf("ValidSet(%q) = %q: want it sorted, every entry once", rs, sorted)
		}
	})
}
