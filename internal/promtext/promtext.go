// Package promtext counts the events nolock's packages report and writes
// the counts in Prometheus's text format (0.0.4), under the names the
// OpenTelemetry adapter (github.com/nolock/nolock/nolockotel) has once
// Prometheus translates them: nolock_events_total and
// nolock_operation_duration_seconds. It is the one place those names are
// spelled for `nolock demo -metrics`, `nolock bench -metrics` and the
// example services' /metrics.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/nolock/nolock/observe"
)

// Counts counts events by name, with the count and total of the durations
// of those that have one. The zero value is ready to use; a Counts is safe
// for concurrent use.
type Counts struct {
	mu     sync.Mutex
	events map[string]*stat
}

type stat struct {
	n, timed uint64
	seconds  float64
}

// Observe counts e: pass it to a package's WithObserver.
func (c *Counts) Observe(_ context.Context, e observe.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.events == nil {
		c.events = map[string]*stat{}
	}
	s := c.events[e.Name]
	if s == nil {
		s = &stat{}
		c.events[e.Name] = s
	}
	s.n++
	if e.Duration > 0 {
		s.timed++
		s.seconds += e.Duration.Seconds()
	}
}

// WriteTo writes the counts in Prometheus's text format (0.0.4), the
// events sorted by name.
func (c *Counts) WriteTo(w io.Writer) (int64, error) {
	c.mu.Lock()
	names := make([]string, 0, len(c.events))
	stats := make(map[string]stat, len(c.events))
	for name, s := range c.events {
		names = append(names, name)
		stats[name] = *s
	}
	c.mu.Unlock()
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

// ServeHTTP serves the counts as a Prometheus scrape target.
func (c *Counts) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = c.WriteTo(w)
}
