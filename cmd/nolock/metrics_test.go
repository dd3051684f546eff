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
// format, under the OpenTelemetry adapter's names (see internal/telemetry):
// a call's duration from its Start in the histogram of its meaning, an
// event without a call as an outcome.
func TestMetricsServed(t *testing.T) {
	m := &promtext.Counts{}
	var log strings.Builder
	stop, err := serveMetrics("127.0.0.1:0", m, &log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	workload(m)
	url := strings.TrimSpace(strings.TrimPrefix(log.String(), "metrics: "))
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, want := range []string{
		"# TYPE nolock_outcomes_total counter\n",
		`nolock_outcomes_total{error_type="_OTHER",nolock_event="inbox.parked"} 1` + "\n",
		"# TYPE nolock_lock_wait_duration_seconds histogram\n",
		`nolock_lock_wait_duration_seconds_count{nolock_call="lease.acquire",nolock_event="lease.acquired"} 2` + "\n",
		`nolock_lock_wait_duration_seconds_bucket{nolock_call="lease.acquire",nolock_event="lease.acquired",le="+Inf"} 2` + "\n",
		`nolock_lock_held{nolock_pattern="lease"} 2` + "\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(string(body), `duration_seconds_count{error_type="_OTHER",nolock_event="inbox.parked"}`) {
		t.Errorf("an event without a call has a duration:\n%s", body)
	}
}

// workload reports two lock acquisitions (calls) and a parked message (an
// event of no call) to o.
func workload(o observe.Observer) {
	for range 2 {
		ctx := o.Start(context.Background(), observe.Call{Name: "lease.acquire", Key: "k"})
		o.End(ctx, observe.Event{Name: "lease.acquired", Key: "k", Duration: time.Millisecond})
	}
	o.Event(context.Background(), observe.Event{Name: "inbox.parked", Err: errors.New("poison")})
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
	workload(m)
	u, err := url.Parse(strings.TrimSpace(strings.TrimPrefix(log.String(), "metrics: ")))
	if err != nil {
		t.Fatal(err)
	}
	prom.Scrape(u.Host)
	sel := `{instance_of="` + prom.Label() + `"}`
	for query, want := range map[string]string{
		`nolock_outcomes_total` + sel:                                      "1",
		`nolock_lock_wait_duration_seconds_count` + sel:                    "2",
		`nolock_lock_held` + sel:                                           "2",
		`sum(nolock_lock_wait_duration_seconds_bucket` + sel + `) by (le)`: "",
	} {
		series := prom.WaitSeries(query)
		if want == "" {
			if len(series) != 19 {
				t.Errorf("%s: %d series, want 19 (one per bucket): %+v", query, len(series), series)
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
