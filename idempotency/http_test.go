package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/internal/testenv"
)

// payHandler is a payment API: POST /pay?amount=N debits alice and writes
// the ledger row named by the X-Payment header, in the middleware's
// transaction. 201 with the new balance; 402 when the balance is short; 503
// while fail is set (a dependency down).
func (b *bed) payHandler(ran *atomic.Int64, fail *atomic.Bool, gate chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		tx, ok := idempotency.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		if gate != nil {
			<-gate
		}
		if fail.Load() {
			http.Error(w, "ledger service unavailable", http.StatusServiceUnavailable)
			return
		}
		amount, _ := strconv.ParseInt(r.URL.Query().Get("amount"), 10, 64)
		if err := debit(r.Context(), tx, "alice", amount); errors.Is(err, errInsufficient) {
			http.Error(w, "insufficient funds", http.StatusPaymentRequired)
			return
		} else if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO ledger VALUES ($1, 'alice', $2)`, r.Header.Get("X-Payment"), amount); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var balance int64
		if err := tx.QueryRow(r.Context(), `SELECT balance FROM wallets WHERE account = 'alice'`).Scan(&balance); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+r.Header.Get("X-Payment"))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%q,"balance":%d}`, r.Header.Get("X-Payment"), balance)
	})
}

type httpBed struct {
	*bed
	srv  *httptest.Server
	ran  atomic.Int64
	fail atomic.Bool
}

func newHTTPBed(t *testing.T, gate chan struct{}, storeOpts []idempotency.Option, opts ...idempotency.MiddlewareOption) *httpBed {
	t.Helper()
	h := &httpBed{bed: newBed(t, storeOpts...)}
	mw, err := idempotency.Middleware(h.store, opts...)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = httptest.NewServer(mw(h.payHandler(&h.ran, &h.fail, gate)))
	t.Cleanup(h.srv.Close)
	return h
}

type reply struct {
	status int
	header http.Header
	body   string
}

func (h *httpBed) post(key, payment string, amount int64) reply {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/pay?amount="+strconv.FormatInt(amount, 10), strings.NewReader(payment))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	req.Header.Set("X-Payment", payment)
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Error(err)
		return reply{}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(body)}
}

func TestMiddlewareReplaysStatusHeadersBody(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, nil)
	first := h.post("key-1", "pay-1", 500)
	if first.status != http.StatusCreated || first.header.Get("Location") != "/payments/pay-1" ||
		first.body != `{"payment":"pay-1","balance":9500}` || first.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("first POST: %+v", first)
	}
	for _, key := range []string{"key-1", `"key-1"`} { // bare, and as an IETF structured-field string
		again := h.post(key, "pay-1", 500)
		if again.status != first.status || again.body != first.body || again.header.Get("Location") != "/payments/pay-1" ||
			again.header.Get("Content-Type") != "application/json" || again.header.Get(idempotency.HeaderReplayed) != "true" {
			t.Fatalf("retry with key %s: %+v, want a replay of %+v", key, again, first)
		}
	}
	if n := h.ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	h.check(1, initial-500)
}

func TestMiddlewareRefusals(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, nil, idempotency.WithMaxBody(64))
	if r := h.post("", "pay-1", 500); r.status != http.StatusBadRequest {
		t.Fatalf("POST without a key: %d, want 400", r.status)
	}
	if r := h.post(strings.Repeat("k", idempotency.MaxKeyLen+1), "pay-1", 500); r.status != http.StatusBadRequest {
		t.Fatalf("POST with a 256-byte key: %d, want 400", r.status)
	}
	if r := h.post("key-1", strings.Repeat("p", 65), 500); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("POST with a body over the limit: %d, want 413", r.status)
	}
	if n := h.ran.Load(); n != 0 {
		t.Fatalf("handler ran %d times for refused requests", n)
	}
	if r := h.post("key-1", "pay-1", 500); r.status != http.StatusCreated {
		t.Fatalf("POST: %+v", r)
	}
	// The same key for another amount (another query) or another body.
	if r := h.post("key-1", "pay-1", 700); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other amount: %d, want 422", r.status)
	}
	if r := h.post("key-1", "pay-2", 500); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other body: %d, want 422", r.status)
	}
	// GET is not handled: no key needed, and the handler sees no transaction.
	resp, err := h.srv.Client().Get(h.srv.URL + "/pay")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInternalServerError { // "no transaction"
		t.Fatalf("GET: %d, want the handler's own 500 (no transaction outside the middleware)", resp.StatusCode)
	}
	if n := h.ran.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (the POST and the GET)", n)
	}
	h.check(1, initial-500)
}

func TestMiddlewareOptionalKey(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, nil, idempotency.WithOptionalKey())
	if r := h.post("", "pay-1", 500); r.status != http.StatusInternalServerError || h.ran.Load() != 1 {
		t.Fatalf("POST without a key, key optional: %+v; want the handler run outside any transaction", r)
	}
}

// A 5xx rolls back and is not stored: the retry runs the handler again.
// A 4xx is a decided outcome: stored and replayed.
func TestMiddlewareStoresOnlyDecidedOutcomes(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, nil)
	h.fail.Store(true)
	if r := h.post("key-1", "pay-1", 500); r.status != http.StatusServiceUnavailable || r.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("POST while the handler fails: %+v, want its 503", r)
	}
	h.check(0, initial)
	h.fail.Store(false)
	if r := h.post("key-1", "pay-1", 500); r.status != http.StatusCreated || r.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("retry after the 503: %+v, want a fresh 201", r)
	}
	h.check(1, initial-500)

	declined := h.post("key-2", "pay-2", initial)
	if declined.status != http.StatusPaymentRequired {
		t.Fatalf("POST above the balance: %+v, want 402", declined)
	}
	mustExec(t, h.pool, `UPDATE wallets SET balance = balance + $1 WHERE account = 'alice'`, initial)
	again := h.post("key-2", "pay-2", initial)
	if again.status != http.StatusPaymentRequired || again.body != declined.body || again.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry of the declined payment after a top-up: %+v, want the replayed 402", again)
	}
	if n := h.ran.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

func TestMiddlewareConcurrentDuplicate(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	h := newHTTPBed(t, gate, []idempotency.Option{idempotency.WithWait(300 * time.Millisecond)})
	first := make(chan reply, 1)
	go func() { first <- h.post("key-1", "pay-1", 500) }()
	testenv.Until(t, "the first request reaches the handler", func() (bool, error) { return h.ran.Load() > 0, nil })
	if r := h.post("key-1", "pay-1", 500); r.status != http.StatusConflict || r.header.Get("Retry-After") == "" {
		t.Fatalf("duplicate while the first runs: %+v, want 409 with Retry-After", r)
	}
	close(gate)
	if r := <-first; r.status != http.StatusCreated {
		t.Fatalf("first: %+v", r)
	}
	if r := h.post("key-1", "pay-1", 500); r.status != http.StatusCreated || r.header.Get(idempotency.HeaderReplayed) != "true" {
		t.Fatalf("retry once the first finished: %+v, want the replayed 201", r)
	}
	if n := h.ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// 8 payments, each POSTed 6 times at once with its key: 8 ledger rows,
// every answer the same 201. Each duplicate waits for the request in
// flight and replays it; the wait is long enough for a first request on
// a loaded machine (the default, 5 s, is not).
func TestMiddlewareConcurrentRetriesTakeEffectOnce(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, []idempotency.Option{idempotency.WithWait(testenv.Scale(30 * time.Second))})
	const payments, deliveries, amount = 8, 6, 100
	var wg sync.WaitGroup
	var replayed atomic.Int64
	for p := 0; p < payments; p++ {
		for d := 0; d < deliveries; d++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := h.post(fmt.Sprint("key-", p), fmt.Sprint("pay-", p), amount)
				if r.status != http.StatusCreated || !strings.Contains(r.body, fmt.Sprintf(`"payment":"pay-%d"`, p)) {
					t.Errorf("payment %d: %+v", p, r)
				}
				if r.header.Get(idempotency.HeaderReplayed) == "true" {
					replayed.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	if h.ran.Load() != payments || replayed.Load() != payments*(deliveries-1) {
		t.Fatalf("handler ran %d times, %d replays; want %d and %d", h.ran.Load(), replayed.Load(), payments, payments*(deliveries-1))
	}
	h.check(payments, initial-payments*amount)
}

// Two clients (scopes) may use the same key without sharing a record.
func TestMiddlewareScope(t *testing.T) {
	t.Parallel()
	h := newHTTPBed(t, nil, nil, idempotency.WithScope(func(r *http.Request, _ []byte) string { return r.Header.Get("X-Payment") }))
	a, b := h.post("same-key", "pay-a", 100), h.post("same-key", "pay-b", 200)
	if a.status != http.StatusCreated || b.status != http.StatusCreated || b.header.Get(idempotency.HeaderReplayed) != "" {
		t.Fatalf("same key in two scopes: %+v, %+v; want two fresh 201s", a, b)
	}
	h.check(2, initial-300)
}

func TestMiddlewareBadSettings(t *testing.T) {
	t.Parallel()
	if _, err := idempotency.Middleware(nil); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("nil store: %v", err)
	}
	store, err := idempotency.New(noIO{t})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idempotency.Middleware(store, idempotency.WithMaxBody(0)); !errors.Is(err, idempotency.ErrInvalid) {
		t.Fatalf("max body 0: %v", err)
	}
	if _, ok := idempotency.TxFromContext(context.Background()); ok {
		t.Fatal("TxFromContext outside the middleware reported a transaction")
	}
}
