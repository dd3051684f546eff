package nolockotel_test

// The adapter's metrics, exported through OpenTelemetry's Prometheus
// exporter and scraped by the test bed's real Prometheus, answer every
// PromQL query docs/observability.md prints.

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/nolock/nolock/idempotency"
	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/lease"
	"github.com/nolock/nolock/nolockotel"
)

// promNames are the Prometheus names of the adapter's instruments, as
// docs/observability.md lists them.
var promNames = []string{
	"nolock_operation_duration_seconds",
	"nolock_lock_wait_duration_seconds",
	"nolock_lock_hold_duration_seconds",
	"nolock_lock_renewal_duration_seconds",
	"messaging_process_duration_seconds",
	"nolock_lock_held",
	"nolock_batch_size",
	"nolock_retries_total",
	"nolock_outcomes_total",
	"nolock_observer_dropped_total",
	"nolock_consumer_lag",
	"nolock_parked_messages",
	"nolock_unreaped_age_seconds",
}

// promBlock is a ```promql block of a Markdown text: one query.
var promBlock = regexp.MustCompile("(?s)```promql\n(.*?)```")

// docQueries returns the queries of docs/observability.md's ```promql
// blocks, each on one line.
func docQueries(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile("../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range promBlock.FindAllStringSubmatch(string(text), -1) {
		out = append(out, strings.Join(strings.Fields(m[1]), " "))
	}
	return out
}

// serveMetrics serves a Prometheus registry's metrics at
// http://127.0.0.1:port/metrics until the test ends, and returns the
// address.
func serveMetrics(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ln.Addr().String()
}

// A workload of lease, idempotency, an inbox and a partition Consumer on
// the real services, observed by one Adapter whose meter provider exports
// through the Prometheus exporter; the test bed's Prometheus scrapes it,
// and each query of the doc, restricted to this test's samples, returns
// at least one series.
func TestDocQueriesOnPrometheus(t *testing.T) {
	t.Parallel()
	prom := testenv.Prometheus(t)
	t.Cleanup(http.DefaultClient.CloseIdleConnections) // the queries' and the scrape check's
	queries := docQueries(t)
	if len(queries) < 5 {
		t.Fatalf("docs/observability.md prints %d ```promql queries, want the dashboard's", len(queries))
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	a, err := nolockotel.New(nolockotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	pool, _ := testenv.PostgresSchema(t, 12)
	ctx := context.Background()

	// A lock held and renewed (and one acquired and released), one found
	// held.
	locks, err := lease.New(pool, lease.WithObserver(a), lease.WithLease(10*time.Second), lease.WithHeartbeat(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	if err := locks.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := locks.Acquire(ctx, "jobs/held"); err != nil {
		t.Fatal(err)
	}
	if _, err := locks.TryAcquire(ctx, "jobs/held"); !errors.Is(err, lease.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held lock: %v, want ErrNotAcquired", err)
	}
	l, err := locks.Acquire(ctx, "jobs/once")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A request and its retry.
	store, err := idempotency.New(pool, idempotency.WithObserver(a))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := store.Do(ctx, "orders", "order-1", nil, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			return []byte("ok"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Messages through an inbox (one poison: retried, then parked) and a
	// partition Consumer, which stays up for its lag.
	exec(t, pool, `CREATE TABLE results (consumer text, id text, PRIMARY KEY (consumer, id))`)
	brokers, topic := testenv.Topic(t, 1)
	const n = 6
	produceWithIDs(t, brokers, topic, n)
	runInbox(t, a, pool, brokers, topic, n-1)
	stopConsumer := runConsumer(t, a, pool, brokers, topic, n)
	defer stopConsumer()

	if _, err := a.ObserveTables(pool, nolockotel.Tables{
		Parked:      []string{inbox.DefaultTable + "_parked"},
		Idempotency: []string{idempotency.DefaultTable},
		Inbox:       map[string]time.Duration{inbox.DefaultTable: time.Hour},
	}); err != nil {
		t.Fatal(err)
	}

	addr := serveMetrics(t, reg)
	prom.Scrape(addr)
	var names map[string]bool
	testenv.Until(t, "every instrument served (a renewal of the held lock among them)", func() (bool, error) {
		names = metricNames(t, addr)
		for _, name := range promNames {
			if !names[name] && name != "nolock_observer_dropped_total" { // a series only once something was dropped
				return false, nil
			}
		}
		return true, nil
	})
	for _, q := range queries {
		prom.Query(q) // the doc's query as printed: Prometheus accepts it
		scoped := scope(q, names, prom.Label())
		series := prom.WaitSeries(scoped)
		t.Logf("%s: %d series", scoped, len(series))
	}
}

// metricNames returns the metric family names that addr serves.
func metricNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			out[f[0]] = true
			if len(f) > 1 && f[1] == "histogram" {
				out[f[0]+"_bucket"], out[f[0]+"_count"], out[f[0]+"_sum"] = true, true, true
			}
		}
	}
	return out
}

var identifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)

// scope returns query with instance_of="label" added to the selector of
// each metric of names it reads (outside quoted strings), so that it
// reads this test's samples only.
func scope(query string, names map[string]bool, label string) string {
	var b strings.Builder
	last := 0
	quoted := false
	for _, m := range identifier.FindAllStringIndex(query, -1) {
		quoted = quoted != (strings.Count(query[last:m[0]], `"`)%2 == 1)
		b.WriteString(query[last:m[1]])
		last = m[1]
		if quoted || !names[query[m[0]:m[1]]] {
			continue
		}
		if strings.HasPrefix(query[last:], "{") {
			b.WriteString(`{instance_of="` + label + `",`)
			last++
		} else {
			b.WriteString(`{instance_of="` + label + `"}`)
		}
	}
	b.WriteString(query[last:])
	return b.String()
}
