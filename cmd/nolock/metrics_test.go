package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/observe"
)

// -metrics serves what the scenes' clients report, in Prometheus's text
// format, under the OpenTelemetry adapter's names: a count per event and
// the durations of those that have one.
func TestMetricsServed(t *testing.T) {
	m := &metrics{}
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
