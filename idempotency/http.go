package idempotency

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/idemrecord"
	"github.com/nolock/nolock/internal/option"
)

// The headers the middleware reads and writes.
const (
	// HeaderKey carries the client's idempotency key (IETF httpapi draft
	// "The Idempotency-Key HTTP Header Field"; Stripe uses the same name).
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on a response replayed from the
	// store, so a client can tell a replay from a fresh result.
	HeaderReplayed = "Idempotent-Replayed"
)

// MiddlewareOption configures Middleware: WithMethods, WithOptionalKey,
// WithMaxBody, WithScope, WithFingerprint, WithProblemWriter.
type MiddlewareOption func(*middleware)

// WithScope makes scope(r, body) the scope of the request's key, so that
// two clients sending the same key do not share a record: use the
// authenticated account (from the request, or from the body, which the
// middleware has read whole: the handler gets the same bytes, so the
// scope and the effect read one account). Without it every client shares
// the scope "", and a client that reuses another's key receives that
// client's stored response without its handler, or its authorization
// check, running. scope must not be nil, and must return a valid scope
// (see ValidKey); otherwise the request fails with 500.
func WithScope(scope func(r *http.Request, body []byte) string) MiddlewareOption {
	return func(m *middleware) { m.scope, m.scopeSet = scope, true }
}

// WithMethods sets the methods the middleware handles (default POST and
// PATCH); requests with other methods go straight to the handler. Methods
// are case-sensitive (RFC 9110): each must be one of net/http's Method
// constants, spelled as they are ("POST", not "post"), and the list must
// not be empty; Middleware refuses any other list with ErrInvalid.
func WithMethods(methods ...string) MiddlewareOption {
	return func(m *middleware) { m.methods = slices.Clone(methods) }
}

// WithOptionalKey lets requests without an Idempotency-Key through to the
// handler, outside any transaction of the middleware (TxFromContext
// reports false). By default they are refused with 400.
func WithOptionalKey() MiddlewareOption { return func(m *middleware) { m.optional = true } }

// WithMaxBody bounds the request body the middleware reads to compute the
// fingerprint (default 1 MiB); a larger body is refused with 413.
func WithMaxBody(n int64) MiddlewareOption { return func(m *middleware) { m.maxBody = n } }

type middleware struct {
	store          *Store
	next           http.Handler
	scope          func(*http.Request, []byte) string
	scopeSet       bool // WithScope was given
	fingerprint    func(*http.Request, []byte) ([]byte, error)
	fingerprintSet bool // WithFingerprint was given
	problem        func(http.ResponseWriter, *http.Request, Problem)
	problemSet     bool // WithProblemWriter was given
	methods        []string
	optional       bool
	maxBody        int64
}

type txKey struct{}

// TxFromContext returns the transaction the middleware runs the handler
// in: make the request's effect through it, and the effect commits with
// the stored response, or not at all. It reports false outside the
// middleware (or for a request let through without a key). The
// transaction follows Func's rules: do not commit or roll it back.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	if ctx == nil {
		return nil, false
	}
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Middleware returns net/http middleware that makes POST and PATCH
// requests with an Idempotency-Key header take effect once, with Store.Do:
// the handler runs inside the transaction (TxFromContext) and its response
// (status, headers, body) is stored with the key.
//
//   - A new key: the handler runs. A response below 500 commits with the
//     handler's writes and is stored (4xx as a terminal outcome); a 5xx
//     response rolls everything back and is passed on, not stored, so the
//     client may retry.
//   - The same key and request again (method, path and query, body; or
//     as WithFingerprint says, such as JSONFingerprint): the
//     stored response is replayed, with Idempotent-Replayed: true.
//   - The same key with another request: 422.
//   - The same key while the first request is still running: the
//     middleware waits for it (the Store's WithWait), then replays or runs;
//     if the wait runs out, 409 with Retry-After.
//   - No key: 400 (unless WithOptionalKey); an invalid key (empty, over
//     MaxKeyLen bytes, not UTF-8): 400; a body over the limit: 413.
//   - A commit whose outcome is unknown, or another failure: 500; the
//     client may retry with the same key.
//
// The middleware's own answers (all of the above but the handler's and
// replayed responses) are RFC 9457 problem details whose type says why
// (see Problem), unless WithProblemWriter writes them otherwise.
//
// The key may be sent bare (Stripe) or as a quoted string (the IETF
// draft). The handler must write its whole response through the
// ResponseWriter it is given (it is buffered; Flush and Hijack are not
// available) and must not act outside the transaction. The middleware is
// safe for concurrent use. Give it a Store on a pool: on a *pgx.Conn the
// requests take turns on the one connection, and a Store on a pgx.Tx is
// refused (ErrInvalid), as requests must not share a transaction.
func Middleware(store *Store, opts ...MiddlewareOption) (func(http.Handler) http.Handler, error) {
	if store == nil {
		return nil, idemrecord.Invalid("store is nil")
	}
	if store.via == viaTx {
		return nil, idemrecord.Invalid("store is on a pgx.Tx: requests must not share a transaction; give the middleware a Store on a pool")
	}
	proto := middleware{store: store, methods: []string{http.MethodPost, http.MethodPatch}, maxBody: 1 << 20,
		fingerprint: defaultFingerprint, problem: WriteProblem}
	if err := option.Apply(opts, func(o MiddlewareOption) { o(&proto) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if proto.scopeSet && proto.scope == nil {
		return nil, idemrecord.Invalid("WithScope(nil): give a scope function, or leave the option out for the shared scope \"\"")
	}
	if proto.fingerprintSet && proto.fingerprint == nil {
		return nil, idemrecord.Invalid("WithFingerprint(nil): give a fingerprint function, or leave the option out for the default")
	}
	if proto.problemSet && proto.problem == nil {
		return nil, idemrecord.Invalid("WithProblemWriter(nil): give a writer, or leave the option out for application/problem+json")
	}
	if proto.maxBody <= 0 {
		return nil, idemrecord.Invalid("WithMaxBody(%d): not positive", proto.maxBody)
	}
	if err := validMethods(proto.methods); err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		m := proto
		m.next = next
		return &m
	}, nil
}

// ServeHTTP handles one request as Middleware describes: it checks the
// request, runs the handler through Store.Do and writes the outcome.
func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.methods, r.Method) {
		m.next.ServeHTTP(w, r)
		return
	}
	key, present := headerKey(r.Header)
	if !present {
		if m.optional {
			m.next.ServeHTTP(w, r)
			return
		}
		m.problem(w, r, problemOf("key-missing", http.StatusBadRequest, "the "+HeaderKey+" header is required"))
		return
	}
	scope, body, ok := m.read(w, r, key)
	if !ok {
		return
	}
	fp, err := m.fingerprint(r, body)
	if err == nil && len(fp) > MaxFingerprintLen {
		err = errfmt.Errorf("idempotency: the fingerprint is %d bytes, more than %d", len(fp), MaxFingerprintLen)
	}
	if err != nil {
		m.problem(w, r, problemOf("fingerprint", http.StatusBadRequest, err.Error()))
		return
	}
	res, err := m.store.Do(r.Context(), scope, key, fp, m.handle(r, body))
	if err != nil {
		m.writeError(w, r, err)
		return
	}
	resp, err := decodeResponse(res.Body)
	if err != nil {
		m.problem(w, r, problemOf("failed", http.StatusInternalServerError, "the stored response cannot be read"))
		return
	}
	resp.write(w, res.Replayed)
}

// read checks the request's scope and key and reads its body, up to the
// limit. ok false means it has answered the request itself (400, 413, or
// 500 for a scope function's invalid scope).
func (m *middleware) read(w http.ResponseWriter, r *http.Request, key string) (scope string, body []byte, ok bool) {
	if err := idemrecord.ValidText("key", key, MaxKeyLen, false); err != nil {
		m.problem(w, r, problemOf("key-invalid", http.StatusBadRequest, err.Error()))
		return "", nil, false
	}
	limit := m.maxBody
	if limit < math.MaxInt64 {
		limit++ // one byte more tells an oversized body
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	if err != nil {
		m.problem(w, r, problemOf("body-unreadable", http.StatusBadRequest, "reading the body: "+err.Error()))
		return "", nil, false
	}
	if int64(len(body)) > m.maxBody {
		m.problem(w, r, problemOf("body-too-large", http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is over %d bytes", m.maxBody)))
		return "", nil, false
	}
	if m.scope != nil {
		scope = m.scope(r, body)
		if err := idemrecord.ValidText("scope", scope, MaxScopeLen, true); err != nil {
			m.problem(w, r, problemOf("failed", http.StatusInternalServerError, "the request's scope is invalid"))
			return "", nil, false
		}
	}
	return scope, body, true
}

// handle returns the Func that runs the handler on r, with body as its
// body, inside Do's transaction, and returns the response to store: a
// response below 400 as a result, a 4xx as a terminal one. A 5xx, a 4xx
// after a failed statement, or a response that cannot be stored and
// replayed is carried out as a *serverError, which rolls everything back.
func (m *middleware) handle(r *http.Request, body []byte) Func {
	return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		rec := &recorder{header: http.Header{}}
		req := r.WithContext(context.WithValue(ctx, txKey{}, tx))
		req.Body = io.NopCloser(bytes.NewReader(body))
		m.next.ServeHTTP(rec, req)
		resp := rec.response()
		if resp.Status >= 500 {
			return nil, &serverError{resp}
		}
		if resp.Status >= 400 && tx.Conn().PgConn().TxStatus() == 'E' {
			// A 4xx answered after a failed statement (a unique
			// violation read as "already exists", say): the transaction
			// cannot commit, so pass the answer on unstored.
			return nil, &serverError{resp}
		}
		enc, err := encodeResponse(resp)
		if err == nil {
			_, err = decodeResponse(enc) // what cannot be replayed must not commit
		}
		if err != nil {
			return nil, unstorableError{err}
		}
		if resp.Status >= 400 {
			return enc, Terminal(nil)
		}
		return enc, nil
	}
}

// writeError answers a request whose Do failed: a response carried out of
// the handler's run (a *serverError) as it is, 422 for a mismatch, 409 with Retry-After while the
// key is in progress, 500 otherwise (details stay out of the answer: they
// name tables and constraints).
func (m *middleware) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var failed *serverError
	switch {
	case errors.As(err, &failed):
		failed.resp.write(w, false)
	case errors.As(err, new(unstorableError)):
		m.problem(w, r, problemOf("response-unstorable", http.StatusInternalServerError, err.Error()))
	case errors.Is(err, ErrMismatch):
		m.problem(w, r, problemOf("key-mismatch", http.StatusUnprocessableEntity, "this key was used for another request"))
	case errors.Is(err, ErrInProgress):
		w.Header().Set("Retry-After", "1")
		m.problem(w, r, problemOf("in-progress", http.StatusConflict, "a request with this key is in progress"))
	case errors.Is(err, ErrAmbiguousCommit):
		m.problem(w, r, problemOf("outcome-unknown", http.StatusInternalServerError, "the outcome is unknown; retry with the same key"))
	default:
		m.problem(w, r, problemOf("failed", http.StatusInternalServerError, "the request failed and was rolled back; retry with the same key"))
	}
}

// response is a recorded HTTP response.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// storedResponse is a response as stored: JSON, with the header block as
// it goes on the wire (so values that are not UTF-8 survive, and what is
// replayed is what the client would have received).
type storedResponse struct {
	Status int    `json:"status"`
	Header []byte `json:"header,omitempty"`
	Body   []byte `json:"body,omitempty"`
}

// encodeResponse encodes r for storage.
func encodeResponse(r response) ([]byte, error) {
	var h bytes.Buffer
	if err := r.Header.Write(&h); err != nil {
		return nil, err
	}
	return json.Marshal(storedResponse{Status: r.Status, Header: h.Bytes(), Body: r.Body})
}

// decodeResponse parses a stored response.
func decodeResponse(b []byte) (response, error) {
	var s storedResponse
	if err := json.Unmarshal(b, &s); err != nil {
		return response{}, errfmt.Errorf("idempotency: stored response: %w", err)
	}
	if s.Status < 100 || s.Status > 999 {
		return response{}, errfmt.Errorf("idempotency: stored response: status %d", s.Status)
	}
	r := response{Status: s.Status, Header: http.Header{}, Body: s.Body}
	if len(s.Header) > 0 {
		block := append(bytes.Clone(s.Header), "\r\n"...)
		h, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(block))).ReadMIMEHeader()
		if err != nil {
			return response{}, errfmt.Errorf("idempotency: stored response header: %w", err)
		}
		r.Header = http.Header(h)
	}
	return r, nil
}

func (r response) write(w http.ResponseWriter, replayed bool) {
	for k, vs := range r.Header {
		w.Header()[k] = slices.Clone(vs)
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// serverError carries a 5xx response out of Do, which rolls back.
type serverError struct{ resp response }

// unstorableError rolls back a run whose response could not be stored and
// replayed (a header value with a control byte, say).
type unstorableError struct{ err error }

func (e unstorableError) Error() string {
	return "the handler's response cannot be stored (" + e.err.Error() + "); nothing was committed"
}

func (e *serverError) Error() string {
	return fmt.Sprintf("idempotency: handler answered %d", e.resp.Status)
}

// recorder buffers the handler's response.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

// WriteHeader keeps the first final status. An informational one (1xx,
// such as 103 Early Hints) is dropped: net/http lets a final status
// follow it, and the final one decides what is stored and committed.
func (r *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status)) // as net/http does
	}
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

func (r *recorder) response() response {
	return response{Status: max(r.status, http.StatusOK), Header: r.header, Body: r.body.Bytes()}
}
