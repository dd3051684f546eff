package idempotency

import (
	"bytes"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
)

// FuzzDecodeResponse feeds the stored-response decoder arbitrary bytes (it
// must not panic, and must refuse a status outside 100-999), and checks
// that a response the middleware encodes decodes to what a client would
// have received: the status, the body byte for byte, and each header value
// (any bytes but controls, not UTF-8 necessarily) under its canonical name.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"status":201,"header":"TG9jYXRpb246IC9wLzENCg==","body":"e30="}`), 201, "Location", "/p/1", []byte("{}"))
	f.Add([]byte(`{"status":0}`), 0, "", "", []byte(nil))
	f.Add([]byte(`null`), 599, "X-Raw", "caf\xe9", []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, stored []byte, status int, name, value string, body []byte) {
		if r, err := decodeResponse(stored); err == nil && (r.Status < 100 || r.Status > 999) {
			t.Fatalf("decoded status %d", r.Status)
		}
		in := response{Status: status, Header: http.Header{}, Body: body}
		if token(name) && headerValue(value) {
			in.Header.Set(name, value)
		}
		enc, err := encodeResponse(in)
		if err != nil {
			t.Fatal(err)
		}
		out, err := decodeResponse(enc)
		if status < 100 || status > 999 {
			if err == nil {
				t.Fatalf("status %d decoded", status)
			}
			return
		}
		if err != nil {
			t.Fatalf("decode of %s: %v", enc, err)
		}
		if out.Status != in.Status || !bytes.Equal(out.Body, in.Body) || len(out.Header) != len(in.Header) {
			t.Fatalf("round trip: %+v became %+v", in, out)
		}
		if len(in.Header) == 1 && out.Header.Get(name) != value {
			t.Fatalf("header %q: %q became %q", textproto.CanonicalMIMEHeaderKey(name), value, out.Header.Get(name))
		}
	})
}

// token reports whether s is an HTTP field name (RFC 9110 token).
func token(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// headerValue reports whether s is a field value a server sends as is: no
// controls but tab, no surrounding whitespace (a parser strips it).
func headerValue(s string) bool {
	for _, c := range []byte(s) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return s == strings.Trim(s, " \t")
}
