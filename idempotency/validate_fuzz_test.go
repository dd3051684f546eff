package idempotency_test

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nolock/nolock/idempotency"
)

// FuzzValidKey checks the key and scope validator against its definition:
// a key is 1 to MaxKeyLen bytes, a scope at most MaxScopeLen, both valid
// UTF-8 without NUL; anything else is ErrInvalid.
func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "k", "a\x00b", "\xff", "é", strings.Repeat("k", 256)} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, scope, key string) {
		ok := func(s string, min, max int) bool {
			return len(s) >= min && len(s) <= max && utf8.ValidString(s) && !strings.ContainsRune(s, 0)
		}
		want := ok(scope, 0, idempotency.MaxScopeLen) && ok(key, 1, idempotency.MaxKeyLen)
		err := idempotency.ValidKey(scope, key)
		if (err == nil) != want {
			t.Fatalf("ValidKey(%q, %q) = %v, want valid %v", scope, key, err, want)
		}
		if err != nil && !errors.Is(err, idempotency.ErrInvalid) {
			t.Fatalf("ValidKey(%q, %q) = %v, want ErrInvalid", scope, key, err)
		}
	})
}
