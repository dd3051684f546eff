package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/examples/internal/servicetest"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Two replicas as processes on DynamoDB: one holds the lock and commits
// generations; a commit held in flight when SIGTERM comes is applied
// (200) before the holder exits 0 and releases the lock; the other takes
// over with a higher token, long before its 10-minute lease could run
// out, and its commits carry that token as the manifest's fence.
func TestCompactorService(t *testing.T) {
	bin := servicetest.Build(t)
	servicetest.MissingEnv(t, bin, "DYNAMODB_TABLE")

	endpoint := testenv.DynamoDBEndpoint(t)
	client := testenv.DynamoDB(t)
	table := testenv.Name("t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := services.DeleteTable(ctx, client, table); err != nil {
			t.Errorf("delete table: %v", err)
		}
	})
	g := newGate(t, endpoint)
	env := []string{"DYNAMODB_TABLE=" + table, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		"JOB_INTERVAL=20ms", "LEASE=10m"}
	a := servicetest.Start(t, bin, append(env, "AWS_ENDPOINT_URL="+g.url)...)
	testenv.Until(t, "a leads and commits", func() (bool, error) {
		l := a.Leader()
		return l.Leader && l.Steps >= 3, nil
	})
	b := servicetest.Start(t, bin, append(env, "AWS_ENDPOINT_URL="+endpoint)...)
	first := a.Leader()
	if l := b.Leader(); l.Leader {
		t.Fatalf("both lead: %+v and %+v", first, l)
	}
	a.WaitMetrics(`nolock_lock_wait_duration_seconds_count{nolock_call="dynamolock.acquire",nolock_event="dynamolock.acquired"} 1`) // ApplyUpdate sends nothing itself, so it reports no event

	g.close()
	<-g.held
	a.Terminate()
	a.WaitRefusing()
	close(g.open)
	if status := <-g.result; status != http.StatusOK {
		t.Fatalf("the commit in flight at SIGTERM: %d, want 200", status)
	}
	if code := a.ExitCode(); code != 0 {
		t.Fatalf("a exited %d after SIGTERM, want 0", code)
	}
	var second service.LeaderStatus
	testenv.Until(t, "b takes over", func() (bool, error) {
		second = b.Leader()
		return second.Leader && second.Steps >= 2, nil
	})
	if second.Token <= first.Token {
		t.Fatalf("b leads with token %d, not above a's %d", second.Token, first.Token)
	}
	_, body, _ := b.Do(http.MethodGet, "/manifest", "")
	var m map[string]string
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	if m["fence"] != strconv.FormatInt(second.Token, 10) || m["files"] != "gen-"+m["generation"] {
		t.Fatalf("manifest %v: want b's token %d as its fence", m, second.Token)
	}
	b.Stop()
}

// gate is a proxy to DynamoDB that, once closed, holds the next manifest
// commit (an UpdateItem of a "manifest/" key) until open is closed, then
// forwards it and reports its status.
type gate struct {
	url    string
	proxy  *httputil.ReverseProxy
	mu     sync.Mutex
	armed  bool
	held   chan struct{}
	open   chan struct{}
	result chan int
}

func newGate(t *testing.T, endpoint string) *gate {
	u, err := url.Parse(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	g := &gate{proxy: httputil.NewSingleHostReverseProxy(u), held: make(chan struct{}, 1), open: make(chan struct{}), result: make(chan int, 1)}
	g.proxy.Transport = tr
	srv := httptest.NewServer(g)
	t.Cleanup(func() { srv.Close(); tr.CloseIdleConnections() })
	g.url = srv.URL
	return g
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed = true
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	g.mu.Lock()
	hold := g.armed && strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".UpdateItem") && bytes.Contains(body, []byte("manifest/"))
	if hold {
		g.armed = false
	}
	g.mu.Unlock()
	if !hold {
		g.proxy.ServeHTTP(w, r)
		return
	}
	g.held <- struct{}{}
	<-g.open
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	g.proxy.ServeHTTP(rec, r)
	g.result <- rec.status
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}
