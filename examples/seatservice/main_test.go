package main

import (
	"encoding/json"
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The service as a process, on PostgreSQL directly and behind PgBouncer: a
// held seat refuses a second holder (409), hold-any gives the free one, a
// confirmed seat stays its holder's, a released one is free; /metrics
// counts the holds' events; a hold in flight when SIGTERM comes gets its
// answer, then the service exits 0.
func TestSeatService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DATABASE_URL")
	for _, d := range servicetest.Deployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema (and topic)
			testSeats(t, bin, d)
		})
	}
}

func testSeats(t *testing.T, bin string, d servicetest.Deployment) {
	pool, schema := testenv.PostgresSchema(t, 2)
	p := servicetest.Start(t, bin, "DATABASE_URL="+d.DSN(t, schema))
	call := func(method, path, body string, want int) status {
		t.Helper()
		got, answer, _ := p.Do(method, path, body)
		if got != want {
			t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, got, answer, want)
		}
		var st status
		if got == http.StatusOK {
			if err := json.Unmarshal([]byte(answer), &st); err != nil {
				t.Fatalf("%s: %v", answer, err)
			}
		}
		return st
	}
	for _, seat := range []string{"1A", "1B", "1C"} {
		call(http.MethodPut, "/seats/"+seat, "", http.StatusOK)
	}
	if st := call(http.MethodPost, "/seats/1A/hold", `{"holder": "alice"}`, http.StatusOK); st.Until == nil {
		t.Fatalf("a hold without its end: %+v", st)
	}
	call(http.MethodPost, "/seats/1A/hold", `{"holder": "bob"}`, http.StatusConflict)
	if st := call(http.MethodPost, "/holds", `{"holder": "bob", "seats": ["1A", "1B"]}`, http.StatusOK); st.Seat != "1B" {
		t.Fatalf("bob's hold-any got %q, want 1B, the free one", st.Seat)
	}
	call(http.MethodPost, "/seats/1A/confirm", `{"holder": "bob"}`, http.StatusConflict)
	call(http.MethodPost, "/seats/1A/confirm", `{"holder": "alice"}`, http.StatusOK)
	call(http.MethodPost, "/seats/1B/release", `{"holder": "bob"}`, http.StatusOK)
	call(http.MethodGet, "/seats/9Z", "", http.StatusNotFound)
	if st := call(http.MethodGet, "/seats/1A", "", http.StatusOK); st.Holder != "alice" || !st.Confirmed {
		t.Fatalf("1A: %+v, want confirmed by alice", st)
	}
	if st := call(http.MethodGet, "/seats/1B", "", http.StatusOK); st.Holder != "" {
		t.Fatalf("1B: %+v, want free", st)
	}
	p.WaitMetrics(`nolock_operation_duration_seconds_count{nolock_call="conditional.hold",nolock_event="conditional.held"}`,
		`nolock_operation_duration_seconds_count{nolock_call="conditional.confirm",nolock_event="conditional.confirmed"} 1`,
		`nolock_operation_duration_seconds_count{nolock_call="conditional.release",nolock_event="conditional.released"} 1`)

	status, body := p.StopDuring(pool, `SELECT FROM nolock_holds FOR UPDATE`, http.MethodPost, "/seats/1C/hold", `{"holder": "carol"}`)
	if status != http.StatusOK {
		t.Fatalf("the hold in flight at SIGTERM: %d %s, want 200", status, body)
	}
	holds, err := conditional.NewHolds(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer holds.Close()
	if st, err := holds.Get(t.Context(), "1C"); err != nil || st.Holder != "carol" {
		t.Fatalf("1C: %+v (%v), want held by carol", st, err)
	}
}
