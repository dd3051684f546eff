package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nolock/nolock/observe"
)

// metricsFlag defines -metrics: where to serve the events as Prometheus
// text while the command runs.
func metricsFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "metrics", "", "serve the library's events as Prometheus text on `ADDR` (e.g. :9464) at /metrics while the command runs")
}

// metrics counts the events nolock's packages report, by name, with the
// count and total of their durations, under the names the OpenTelemetry
// adapter (github.com/nolock/nolock/nolockotel) has once Prometheus translates
// them: nolock_events_total and nolock_operation_duration_seconds.
type metrics struct {
	mu     sync.Mutex
	events map[string]*eventStat
}

type eventStat struct {
	n, timed uint64
	seconds  float64
}

// Observe is the observe.Func each scene's clients report to: it counts
// every event, calls' outcomes (End) included.
func (m *metrics) Observe(_ context.Context, e observe.Event) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.events == nil {
		m.events = map[string]*eventStat{}
	}
	s := m.events[e.Name]
	if s == nil {
		s = &eventStat{}
		m.events[e.Name] = s
	}
	s.n++
	if e.Duration > 0 {
		s.timed++
		s.seconds += e.Duration.Seconds()
	}
}

// withMetrics serves -metrics at addr, if given, and returns the observer
// to give the library's clients (nil without -metrics: they report
// nothing) and what stops the server.
func withMetrics(addr string, log io.Writer) (observe.Observer, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	m := &metrics{}
	stop, err := serveMetrics(addr, m, log)
	if err != nil {
		return nil, nil, err
	}
	return observe.Func(m.Observe), stop, nil
}

// WriteTo writes the counts in Prometheus's text format (0.0.4).
func (m *metrics) WriteTo(w io.Writer) (int64, error) {
	m.mu.Lock()
	names := make([]string, 0, len(m.events))
	stats := make(map[string]eventStat, len(m.events))
	for name, s := range m.events {
		names = append(names, name)
		stats[name] = *s
	}
	m.mu.Unlock()
	slices.Sort(names)
	b := []byte("# HELP nolock_events_total Events reported by nolock's packages, by event.\n# TYPE nolock_events_total counter\n")
	for _, name := range names {
		b = fmt.Appendf(b, "nolock_events_total{nolock_event=%s} %d\n", strconv.Quote(name), stats[name].n)
	}
	b = append(b, "# HELP nolock_operation_duration_seconds How long the events that have a duration took.\n# TYPE nolock_operation_duration_seconds summary\n"...)
	for _, name := range names {
		if s := stats[name]; s.timed > 0 {
			b = fmt.Appendf(b, "nolock_operation_duration_seconds_sum{nolock_event=%s} %g\n", strconv.Quote(name), s.seconds)
			b = fmt.Appendf(b, "nolock_operation_duration_seconds_count{nolock_event=%s} %d\n", strconv.Quote(name), s.timed)
		}
	}
	n, err := w.Write(b)
	return int64(n), err
}

// serveMetrics serves m at addr's /metrics until stop is called. It
// returns once the address is listening, so a scrape right after works.
func serveMetrics(addr string, m *metrics, log io.Writer) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = m.WriteTo(w)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(log, "nolock: metrics:", err)
		}
	}()
	fmt.Fprintf(log, "metrics: http://%s/metrics\n", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
