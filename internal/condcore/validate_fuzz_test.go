package condcore

import (
	"errors"
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
