package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/internal/promtext"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// -metrics serves what the scenes' clients report, in Prometheus's text
// format, under the OpenTelemetry adapter's names: a count per event and
// the durations of those that have one.
func TestMetricsServed(t *testing.T) {
	m := &promtext.Counts{}
	var log strings.Builder
	stop, err := serveMetrics("127.0.0.1:0", m, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	o := m.Observe
	ctx := context.Background()
	o(ctx, observe.Event{Name: "lease.acquired", Duration: 2 * time.Millisecond})
	o(ctx, observe.Event{Name: "lease.acquired", Duration: 3 * time.Millisecond})
	o(ctx, observe.Event{Name: "inbox.parked", Err: errors.New("poison")})
	url := strings.TrimSpace(strings.TrimPrefix(log.String(), "metrics: "))
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, want := range []string{
		"# TYPE nolock_events_total counter\n",
		`nolock_events_total{nolock_event="inbox.parked"} 1` + "\n",
		`nolock_events_total{nolock_event="lease.acquired"} 2` + "\n",
		`nolock_operation_duration_seconds_sum{nolock_event="lease.acquired"} 0.005` + "\n",
		`nolock_operation_duration_seconds_count{nolock_event="lease.acquired"} 2` + "\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), `duration_seconds_count{nolock_event="inbox.parked"}`) {
		t.Errorf("an event without a duration has a duration:\n%s", body)
	}
}

// A real Prometheus scrapes -metrics and reads every series it serves.
func TestMetricsScrapedByPrometheus(t *testing.T) {
	prom := testenv.Prometheus(t)
	m := &promtext.Counts{}
	var log strings.Builder
	stop, err := serveMetrics("127.0.0.1:0", m, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := context.Background()
	m.Observe(ctx, observe.Event{Name: "lease.acquired", Duration: 2 * time.Millisecond})
	m.Observe(ctx, observe.Event{Name: "lease.acquired", Duration: 3 * time.Millisecond})
	m.Observe(ctx, observe.Event{Name: "inbox.parked", Err: errors.New("poison")})
	u, err := url.Parse(strings.TrimSpace(strings.TrimPrefix(log.String(), "metrics: ")))
	if err != nil {
		t.Fatal(err)
	}
	prom.Scrape(u.Host)
	sel := `{instance_of="` + prom.Label() + `"}`
	for query, want := range map[string]string{
		`nolock_events_total` + sel:                             "3", // summed below
		`nolock_operation_duration_seconds_count` + sel:         "2",
		`nolock_operation_duration_seconds_sum` + sel:           "0.005",
		`sum(nolock_events_total` + sel + `) by (nolock_event)`: "",
	} {
		series := prom.WaitSeries(query)
		if want == "" {
			if len(series) != 2 {
				t.Errorf("%s: %d series, want 2 (one per event): %+v", query, len(series), series)
			}
			continue
		}
		total := 0.0
		for _, s := range series {
			v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
			if err != nil {
				t.Fatalf("%s: value %v: %v", query, s.Value[1], err)
			}
			total += v
		}
		if got := strconv.FormatFloat(total, 'g', -1, 64); got != want {
			t.Errorf("%s = %s, want %s (%+v)", query, got, want, series)
		}
	}
}
