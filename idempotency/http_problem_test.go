package idempotency_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nolock/nolock/idempotency"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	same := [][2]string{
		{`{"a":1,"b":[true,null,{"y":"x","x":"y"}]}`, " { \"b\" : [ true , null , {\"x\":\"y\",\"y\":\"x\"} ] ,\n \"a\" : 1 } "},
		{`"<&>"`, `"\u003c&\u003e"`},
		{`{"a":1,"a":2}`, `{"a":2}`},
	}
	for _, p := range same {
		a, aerr := idempotency.CanonicalJSON([]byte(p[0]))
		b, berr := idempotency.CanonicalJSON([]byte(p[1]))
		if aerr != nil || berr != nil || string(a) != string(b) {
			t.Errorf("%s and %s: %s (%v) and %s (%v); want the same text", p[0], p[1], a, aerr, b, berr)
		}
	}
	differ := [][2]string{{`{"a":1}`, `{"a":2}`}, {`{"a":1}`, `{"a":1.0}`}, {`{"a":1}`, `{"A":1}`}, {`[1,2]`, `[2,1]`}}
	for _, p := range differ {
		a, _ := idempotency.CanonicalJSON([]byte(p[0]))
		b, _ := idempotency.CanonicalJSON([]byte(p[1]))
		if string(a) == string(b) {
			t.Errorf("%s and %s: both %s; want different texts", p[0], p[1], a)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} x`, `{"a":1}{"b":2}`, `nope`} {
		if c, err := idempotency.CanonicalJSON([]byte(bad)); err == nil {
			t.Errorf("%q: %s, want an error", bad, c)
		}
	}
}

// problemBed is the middleware with opts around a handler that counts its
// runs and answers 201 with a body of its own.
func problemBed(t *testing.T, opts ...idempotency.MiddlewareOption) (post func(key, body string) (int, http.Header, string), runs *atomic.Int64) {
	t.Helper()
	b := newBed(t)
	mw, err := idempotency.Middleware(b.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	runs = new(atomic.Int64)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "run "+string(rune('0'+n)))
	})))
	t.Cleanup(srv.Close)
	post = func(key, body string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(got)
	}
	return post, runs
}

// problemType decodes a problem details answer and returns its type, or
// fails the test.
func problemType(t *testing.T, status int, header http.Header, body string, wantStatus int) string {
	t.Helper()
	var p idempotency.Problem
	if ct := header.Get("Content-Type"); ct != "application/problem+json" || json.Unmarshal([]byte(body), &p) != nil || p.Status != status || status != wantStatus {
		t.Fatalf("answer %d %q %s; want %d as application/problem+json", status, ct, body, wantStatus)
	}
	return p.Type
}

// With JSONFingerprint, the same JSON with its keys reordered and its
// whitespace changed replays; a changed value is another request (422, as
// problem details); a body that is not JSON is refused (400).
func TestMiddlewareJSONFingerprint(t *testing.T) {
	t.Parallel()
	post, runs := problemBed(t, idempotency.WithFingerprint(idempotency.JSONFingerprint))
	if status, h, body := post("k1", `{"account":"alice","cents":500}`); status != http.StatusCreated || body != "run 1" || h.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("first: %d %s", status, body)
	}
	if status, h, body := post("k1", "{ \"cents\": 500,\n  \"account\": \"alice\" }"); status != http.StatusCreated || body != "run 1" || h.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("the same JSON reordered: %d %s replayed %q; want the replay of run 1", status, body, h.Get(idempotency.HeaderReplayed))
	}
	status, h, body := post("k1", `{"account":"alice","cents":501}`)
	if typ := problemType(t, status, h, body, http.StatusUnprocessableEntity); typ != "urn:nolock:idempotency:key-mismatch" {
		t.Fatalf("a changed value: type %q", typ)
	}
	status, h, body = post("k2", `not json`)
	if typ := problemType(t, status, h, body, http.StatusBadRequest); typ != "urn:nolock:idempotency:fingerprint" {
		t.Fatalf("a body that is not JSON: type %q", typ)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// The middleware's own refusals are problem details by default, or go
// through WithProblemWriter.
func TestMiddlewareProblems(t *testing.T) {
	t.Parallel()
	post, _ := problemBed(t)
	status, h, body := post("", `{}`)
	if typ := problemType(t, status, h, body, http.StatusBadRequest); typ != "urn:nolock:idempotency:key-missing" {
		t.Fatalf("no key: type %q", typ)
	}
	status, h, body = post(strings.Repeat("k", idempotency.MaxKeyLen+1), `{}`)
	if typ := problemType(t, status, h, body, http.StatusBadRequest); typ != "urn:nolock:idempotency:key-invalid" {
		t.Fatalf("a long key: type %q", typ)
	}

	var seen []idempotency.Problem
	post, _ = problemBed(t, idempotency.WithProblemWriter(func(w http.ResponseWriter, _ *http.Request, p idempotency.Problem) {
		seen = append(seen, p)
		w.WriteHeader(p.Status)
		_, _ = io.WriteString(w, "custom "+p.Type)
	}))
	if status, _, body := post("", `{}`); status != http.StatusBadRequest || body != "custom urn:nolock:idempotency:key-missing" || len(seen) != 1 {
		t.Fatalf("no key, through the writer: %d %q (%d problems seen)", status, body, len(seen))
	}
	b := newBed(t)
	for _, opt := range []idempotency.MiddlewareOption{idempotency.WithProblemWriter(nil), idempotency.WithFingerprint(nil)} {
		if _, err := idempotency.Middleware(b.store, opt); !errors.Is(err, idempotency.ErrInvalid) {
			t.Fatalf("a nil function: %v, want ErrInvalid", err)
		}
	}
}

// WithScope sees the body: a scope taken from it keeps two accounts' uses
// of one key apart.
func TestMiddlewareScopeFromBody(t *testing.T) {
	t.Parallel()
	post, runs := problemBed(t, idempotency.WithScope(func(_ *http.Request, body []byte) string {
		var p struct{ Account string }
		_ = json.Unmarshal(body, &p)
		return p.Account
	}))
	for i, c := range []struct {
		body, want string
		replayed   bool
	}{
		{`{"account":"alice"}`, "run 1", false},
		{`{"account":"bob"}`, "run 2", false},
		{`{"account":"alice"}`, "run 1", true},
	} {
		status, h, body := post("same-key", c.body)
		if status != http.StatusCreated || body != c.want || (h.Get(idempotency.HeaderReplayed) == "true") != c.replayed {
			t.Fatalf("request %d (%s): %d %q replayed %q; want %q replayed %v", i, c.body, status, body, h.Get(idempotency.HeaderReplayed), c.want, c.replayed)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("the handler ran %d times, want 2", n)
	}
}
