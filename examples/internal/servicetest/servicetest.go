// Package servicetest runs an example service as a process for its end to
// end test: it builds the test's package (a main) into the test's temporary
// folder, starts it with the environment the test gives, waits for
// /healthz, and sends it requests and signals.
package servicetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nolock/nolock/examples/internal/service"
	"github.com/nolock/nolock/internal/testenv"
)

// Build builds the main package in the test's directory and returns the
// binary's path; built with -race when the test is.
func Build(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "service")
	args := []string{"build", "-o", bin}
	if testenv.Race() {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Proc is a service process.
type Proc struct {
	*testenv.Child
	t      testing.TB
	URL    string // http://host:port, where it listens
	client *http.Client
}

// Env returns the environment a service process needs besides its own
// settings: PATH and HOME, and the service listening on a free loopback
// port.
func Env(settings ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "ADDR=127.0.0.1:0"}, settings...)
}

// Start starts bin with Env(settings...), waits until it listens and its
// /healthz answers 200.
func Start(t testing.TB, bin string, settings ...string) *Proc {
	t.Helper()
	c := testenv.StartProcess(t, bin, Env(settings...)...)
	line := c.WaitFor("msg=listening", 2*time.Minute)
	i := strings.Index(line, "addr=")
	if i < 0 {
		t.Fatalf("no addr= in %q", line)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections) // after the process ended: no connection outlives the test
	p := &Proc{Child: c, t: t, URL: "http://" + strings.Fields(line[i+len("addr="):])[0], client: &http.Client{Transport: tr}}
	p.WaitHealth(http.StatusOK)
	return p
}

// WaitHealth polls /healthz until it answers status.
func (p *Proc) WaitHealth(status int) {
	p.t.Helper()
	testenv.Until(p.t, fmt.Sprintf("/healthz answers %d", status), func() (bool, error) {
		got, _, _ := p.try(http.MethodGet, "/healthz", "")
		return got == status, nil
	})
}

// Do sends a request with body (JSON, or none when empty) and headers
// ("Name: value") and returns the status, the body and the headers.
func (p *Proc) Do(method, path, body string, headers ...string) (int, string, http.Header) {
	p.t.Helper()
	status, b, h := p.try(method, path, body, headers...)
	if status == 0 {
		p.t.Fatalf("%s %s: %s", method, path, b)
	}
	return status, b, h
}

// try is Do that returns status 0 and the error's text on a failed round
// trip.
func (p *Proc) try(method, path, body string, headers ...string) (int, string, http.Header) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.URL+path, r)
	if err != nil {
		return 0, err.Error(), nil
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	res, err := p.client.Do(req)
	if err != nil {
		return 0, err.Error(), nil
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err.Error(), nil
	}
	return res.StatusCode, string(b), res.Header
}

// WaitMetrics polls /metrics until it has a line starting with each of
// series (e.g. `nolock_lock_wait_duration_seconds_count{nolock_event="lease.acquired"}`), and
// returns the last scrape.
func (p *Proc) WaitMetrics(series ...string) string {
	p.t.Helper()
	var body string
	err := testenv.Poll("/metrics has "+strings.Join(series, ", "), func() (bool, error) {
		_, body, _ = p.Do(http.MethodGet, "/metrics", "")
		for _, s := range series {
			if !strings.Contains("\n"+body, "\n"+s) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		p.t.Fatalf("%v; the last scrape:\n%s", err, body)
	}
	return body
}

// WaitRefusing waits until the service refuses new connections: it has
// stopped accepting.
func (p *Proc) WaitRefusing() {
	p.t.Helper()
	addr := strings.TrimPrefix(p.URL, "http://")
	testenv.Until(p.t, "the service refuses connections", func() (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return true, nil
		}
		c.Close()
		return false, nil
	})
}

// Stop sends SIGTERM and fails the test unless the service exits 0.
func (p *Proc) Stop() {
	p.t.Helper()
	p.Terminate()
	if code := p.ExitCode(); code != 0 {
		p.t.Fatalf("the service exited %d after SIGTERM, want 0", code)
	}
}

// Leader returns the service's GET /leader (see service.Leader).
func (p *Proc) Leader() service.LeaderStatus {
	p.t.Helper()
	_, body, _ := p.Do(http.MethodGet, "/leader", "")
	var l service.LeaderStatus
	if err := json.Unmarshal([]byte(body), &l); err != nil {
		p.t.Fatalf("/leader: %s: %v", body, err)
	}
	return l
}

// MissingEnv starts bin with none of its settings and requires it to exit
// 2 with a line naming every one of want.
func MissingEnv(t testing.TB, bin string, want ...string) {
	t.Helper()
	c := testenv.StartProcess(t, bin, Env()...)
	line := c.WaitFor("not set", time.Minute)
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("%q does not name %s", line, w)
		}
	}
	if code := c.ExitCode(); code != 2 {
		t.Errorf("exit %d without settings, want 2", code)
	}
}

// StopDuring proves a request in flight when SIGTERM comes gets its
// answer (see StopWhileLocked): it returns the request's answer, once the
// service exited 0.
func (p *Proc) StopDuring(pool *pgxpool.Pool, lockSQL, method, path, body string, headers ...string) (int, string) {
	p.t.Helper()
	type answer struct {
		status int
		body   string
	}
	inFlight := make(chan answer, 1)
	p.StopWhileLocked(pool, lockSQL, func() {
		go func() {
			status, body, _ := p.try(method, path, body, headers...)
			inFlight <- answer{status, body}
		}()
	})
	got := <-inFlight
	return got.status, got.body
}

// StopWhileLocked proves work in flight when SIGTERM comes finishes: it
// locks rows with lockSQL (a SELECT … FOR UPDATE) in a transaction on
// pool, calls start (which sets off work of the service's that waits for
// that lock), waits until a session waits for the lock, sends SIGTERM,
// waits until the service refuses new connections, then releases the
// lock, and fails the test unless the service exits 0.
func (p *Proc) StopWhileLocked(pool *pgxpool.Pool, lockSQL string, start func()) {
	p.t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, lockSQL); err != nil {
		p.t.Fatal(err)
	}
	start()
	testenv.WaitLockWaiters(p.t, pool, 1)
	p.Terminate()
	p.WaitRefusing()
	if err := tx.Rollback(ctx); err != nil {
		p.t.Fatal(err)
	}
	if code := p.ExitCode(); code != 0 {
		p.t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
}

// Deployment is one way a service reaches PostgreSQL.
type Deployment struct {
	Name string
	// DSN returns the DSN of the test's schema, made with
	// testenv.PostgresSchema, this way.
	DSN func(t testing.TB, schema string) string
}

// Deployments lists the ways a service's test runs it: on PostgreSQL
// directly, and through the shared PgBouncer (transaction pooling) in
// pgx's exec mode, the setting docs/deploying.md gives for PgBouncer
// before 1.21. Both keep the schema's name as application_name, so
// testenv.WaitLockWaiters sees the service's sessions.
func Deployments() []Deployment {
	return []Deployment{
		{"direct", testenv.PostgresDSNFor},
		{"pgbouncer/exec", func(t testing.TB, schema string) string {
			t.Helper()
			u, err := url.Parse(testenv.PgBouncerDSNFor(t, schema))
			if err != nil {
				t.Fatal(err)
			}
			q := u.Query()
			q.Set("default_query_exec_mode", "exec")
			q.Set("application_name", schema)
			u.RawQuery = q.Encode()
			return u.String()
		}},
	}
}
