package idempotency

import (
	"net/http"
	"slices"
	"strings"

	"github.com/nolock/nolock/internal/idemrecord"
)

// knownMethods are the methods WithMethods accepts.
var knownMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace,
}

// validMethods checks WithMethods' list.
func validMethods(methods []string) error {
	if len(methods) == 0 {
		return idemrecord.Invalid("methods is empty: the middleware would protect no request")
	}
	for i, m := range methods {
		if slices.Contains(knownMethods, m) {
			continue
		}
		if up := strings.ToUpper(m); slices.Contains(knownMethods, up) {
			return idemrecord.Invalid("methods[%d] is %q: methods are case-sensitive, and requests carry %q", i, m, up)
		}
		return idemrecord.Invalid("methods[%d] %q is not an HTTP method of net/http", i, m)
	}
	return nil
}

// headerKey returns the Idempotency-Key header's value, unquoted if it is
// a structured-field string ("…", with \" and \\ escapes).
func headerKey(h http.Header) (string, bool) {
	vs := h.Values(HeaderKey)
	if len(vs) == 0 {
		return "", false
	}
	v := strings.TrimSpace(vs[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(v[1 : len(v)-1])
	}
	return v, true
}
