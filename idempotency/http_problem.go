package idempotency

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/nolock/nolock/internal/errfmt"
)

// Problem is an answer of the middleware itself, rather than of the
// handler: a refused or failed request, as RFC 9457 problem details.
// Type says why, for a client to act on:
//
//	urn:nolock:idempotency:key-missing      400, no Idempotency-Key
//	urn:nolock:idempotency:key-invalid      400, a key Do would refuse
//	urn:nolock:idempotency:body-unreadable  400, the body could not be read
//	urn:nolock:idempotency:fingerprint      400, WithFingerprint refused the request
//	urn:nolock:idempotency:body-too-large   413, over WithMaxBody
//	urn:nolock:idempotency:key-mismatch     422, the key was used for another request
//	urn:nolock:idempotency:in-progress      409, a request with the key is still running (Retry-After is set)
//	urn:nolock:idempotency:outcome-unknown  500, the commit's outcome is unknown: retry with the same key
//	urn:nolock:idempotency:failed           500, rolled back (or a bad scope): retry with the same key
//	urn:nolock:idempotency:response-unstorable  500, the handler's response cannot be stored and replayed
//	                                        (a header value with a control byte): rolled back
//
// Detail never names a table or constraint.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// WithProblemWriter makes the middleware answer its own refusals and
// failures (see Problem) through write, instead of the default, which
// writes p as application/problem+json. Headers the middleware sets first
// (Retry-After on a 409) are already on w. write must not be nil.
func WithProblemWriter(write func(w http.ResponseWriter, r *http.Request, p Problem)) MiddlewareOption {
	return func(m *middleware) { m.problem, m.problemSet = write, true }
}

// WriteProblem writes p as RFC 9457 problem details: Content-Type
// application/problem+json, status p.Status, p as the JSON body. It is
// the middleware's default problem writer.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p Problem) {
	body, err := json.Marshal(p)
	if err != nil { // a Problem always marshals; keep the status if not
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

// problemOf builds the Problem of type kind (see Problem) with its status.
func problemOf(kind string, status int, detail string) Problem {
	return Problem{Type: "urn:nolock:idempotency:" + kind, Title: http.StatusText(status), Status: status, Detail: detail}
}

// WithFingerprint makes fingerprint(r, body) the request's fingerprint
// (at most MaxFingerprintLen bytes; use Fingerprint), instead of the
// default, Fingerprint of the method, the path with its query, and the
// body's bytes. A request it returns an error for is refused with 400
// (urn:nolock:idempotency:fingerprint). JSONFingerprint fingerprints
// JSON bodies by their meaning. fingerprint must not be nil.
func WithFingerprint(fingerprint func(r *http.Request, body []byte) ([]byte, error)) MiddlewareOption {
	return func(m *middleware) { m.fingerprint, m.fingerprintSet = fingerprint, true }
}

// defaultFingerprint is the fingerprint without WithFingerprint.
func defaultFingerprint(r *http.Request, body []byte) ([]byte, error) {
	return Fingerprint([]byte(r.Method), []byte(r.URL.RequestURI()), body), nil
}

// JSONFingerprint is a fingerprint for WithFingerprint: the method, the
// path with its query, and the body's CanonicalJSON, so that the same
// JSON with its keys reordered or its whitespace changed is the same
// request, and a changed value another. A body that is not JSON is
// refused.
func JSONFingerprint(r *http.Request, body []byte) ([]byte, error) {
	c, err := CanonicalJSON(body)
	if err != nil {
		return nil, err
	}
	return Fingerprint([]byte(r.Method), []byte(r.URL.RequestURI()), c), nil
}

// CanonicalJSON returns the JSON value in data with no insignificant
// whitespace and every object's keys sorted, so that two texts of one
// value compare equal. Numbers keep their text (1.0 and 1 differ), and
// an object with a repeated key keeps its last value. data must hold one
// JSON value.
func CanonicalJSON(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, errfmt.Errorf("idempotency: canonical JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errfmt.Errorf("idempotency: canonical JSON: more than one value")
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out) // maps are written with sorted keys
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, errfmt.Errorf("idempotency: canonical JSON: %w", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), nil
}
