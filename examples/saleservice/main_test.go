package main

import (
	"net/http"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The service as a process, on PostgreSQL directly and behind PgBouncer:
// 40 buyers race for 25 units, 25 get one and 15 are told sold out, and
// the stock reads 0; /metrics counts grants and refusals; a take in flight
// when SIGTERM comes gets its answer, then the service exits 0.
func TestSaleService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DATABASE_URL")
	for _, d := range servicetest.Deployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema (and topic)
			testSale(t, bin, d)
		})
	}
}

func testSale(t *testing.T, bin string, d servicetest.Deployment) {
	pool, schema := testenv.PostgresSchema(t, 2)
	p := servicetest.Start(t, bin, "DATABASE_URL="+d.DSN(t, schema))
	const units, buyers = 25, 40
	if status, body, _ := p.Do(http.MethodPost, "/stock/tv/restock", `{"units": 25}`); status != http.StatusOK {
		t.Fatalf("restock: %d %s", status, body)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answers := map[int]int{}
	for range buyers {
		wg.Go(func() {
			status, _, _ := p.Do(http.MethodPost, "/stock/tv/take", `{"units": 1}`)
			mu.Lock()
			answers[status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if answers[http.StatusOK] != units || answers[http.StatusConflict] != buyers-units {
		t.Fatalf("answers by status %v, want %d × 200 and %d × 409", answers, units, buyers-units)
	}
	if status, body, _ := p.Do(http.MethodGet, "/stock/tv", ""); status != http.StatusOK || body != `{"sku":"tv","units":0}`+"\n" {
		t.Fatalf("stock after the sale: %d %s", status, body)
	}
	if status, _, _ := p.Do(http.MethodPost, "/stock/radio/take", `{"units": 1}`); status != http.StatusNotFound {
		t.Fatalf("a take of an unknown SKU: %d, want 404", status)
	}
	p.WaitMetrics(`nolock_operation_duration_seconds_count{nolock_call="conditional.take",nolock_event="conditional.granted"}`, `nolock_operation_duration_seconds_count{error_type="conditional.ErrSoldOut",nolock_call="conditional.take",nolock_event="conditional.refused"}`)

	if status, body, _ := p.Do(http.MethodPost, "/stock/tv/restock", `{"units": 1}`); status != http.StatusOK {
		t.Fatalf("restock: %d %s", status, body)
	}
	if status, body := p.StopDuring(pool, `SELECT FROM nolock_stock FOR UPDATE`, http.MethodPost, "/stock/tv/take", `{"units": 1}`); status != http.StatusOK {
		t.Fatalf("the take in flight at SIGTERM: %d %s, want 200", status, body)
	}
	stock, err := conditional.NewStock(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer stock.Close()
	if n, err := stock.Available(t.Context(), "tv"); err != nil || n != 0 {
		t.Fatalf("%d units left (%v), want 0: the take in flight did not commit", n, err)
	}
}
