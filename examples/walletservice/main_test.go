package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The service as a process, on PostgreSQL directly and behind PgBouncer: a
// payment replayed with its key takes effect once, a key reused for
// another payment is refused, a debit past the balance is declined once;
// the reaper runs on its interval; /metrics counts the middleware's
// events; SIGTERM lets a debit in flight finish, then the service exits 0.
func TestWalletService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DATABASE_URL")
	for _, d := range servicetest.Deployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema (and topic)
			testWallet(t, bin, d)
		})
	}
}

func testWallet(t *testing.T, bin string, d servicetest.Deployment) {
	pool, schema := testenv.PostgresSchema(t, 2)
	p := servicetest.Start(t, bin, "DATABASE_URL="+d.DSN(t, schema), "REAP_INTERVAL=50ms")
	p.WaitFor("reaper=idempotency", time.Minute)

	expect := func(status int, want int, body, wantBody string) {
		t.Helper()
		if status != want || (wantBody != "" && body != wantBody) {
			t.Fatalf("got %d %s, want %d %s", status, body, want, wantBody)
		}
	}
	status, body, _ := p.Do(http.MethodPut, "/wallets/w1", `{"balance": 1000}`)
	expect(status, http.StatusCreated, body, `{"id":"w1","balance":1000}`+"\n")
	first, firstBody, _ := p.Do(http.MethodPost, "/wallets/w1/debits", `{"amount": 300}`, "Idempotency-Key: pay-1")
	expect(first, http.StatusCreated, firstBody, `{"id":"w1","balance":700}`+"\n")
	status, body, h := p.Do(http.MethodPost, "/wallets/w1/debits", `{"amount": 300}`, "Idempotency-Key: pay-1")
	expect(status, first, body, firstBody)
	if h.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the replay lacks Idempotent-Replayed: true: %v", h)
	}
	status, body, _ = p.Do(http.MethodPost, "/wallets/w1/debits", `{"amount": 400}`, "Idempotency-Key: pay-1")
	expect(status, http.StatusUnprocessableEntity, body, "")
	for range 2 {
		status, body, _ = p.Do(http.MethodPost, "/wallets/w1/debits", `{"amount": 800}`, "Idempotency-Key: pay-2")
		expect(status, http.StatusPaymentRequired, body, "")
	}
	p.WaitMetrics(`nolock_operation_duration_seconds_count{nolock_call="idempotency.do",nolock_event="idempotency.ran"} 2`,
		`nolock_operation_duration_seconds_count{nolock_call="idempotency.do",nolock_event="idempotency.replayed"} 2`,
		`nolock_operation_duration_seconds_count{error_type="idempotency.ErrMismatch",nolock_call="idempotency.do",nolock_event="idempotency.mismatch"} 1`)

	// A debit in flight when SIGTERM comes: it waits on the wallet's row,
	// locked here, until the service has stopped accepting.
	status, body = p.StopDuring(pool, `SELECT FROM wallets WHERE id = 'w1' FOR UPDATE`,
		http.MethodPost, "/wallets/w1/debits", `{"amount": 100}`, "Idempotency-Key: pay-3")
	expect(status, http.StatusCreated, body, `{"id":"w1","balance":600}`+"\n")
	ctx := context.Background()
	var rows, debited int64
	if err := pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM wallet_ledger`).Scan(&rows, &debited); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || debited != 400 {
		t.Fatalf("ledger: %d rows, %d debited; want 2 rows, 400 (pay-1 and pay-3 once each)", rows, debited)
	}
}

// /healthz answers 503 while the database does not answer (its link cut
// by a gate that holds every packet), and 200 again once it does.
func TestWalletServiceHealth(t *testing.T) {
	bin := servicetest.Build(t)
	_, schema := testenv.PostgresSchema(t, 1)
	gate := testenv.NewGate()
	dsn := testenv.Proxy(t, testenv.PostgresDSNFor(t, schema), gate.Relay(), gate.Relay())
	p := servicetest.Start(t, bin, "DATABASE_URL="+dsn)
	gate.Shut()
	p.WaitHealth(http.StatusServiceUnavailable)
	gate.Open()
	p.WaitHealth(http.StatusOK)
	p.Stop()
}
