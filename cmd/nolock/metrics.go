package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/nolock/nolock/internal/promtext"
	"github.com/nolock/nolock/observe"
)

// metricsFlag defines -metrics: where to serve the events as Prometheus
// text while the command runs.
func metricsFlag(fs *flag.FlagSet, p *string) {
	fs.StringVar(p, "metrics", "", "serve the library's events as Prometheus text on `ADDR` (e.g. :9464) at /metrics while the command runs")
}

// withMetrics serves -metrics at addr, if given, and returns the observer
// to give the library's clients (nil without -metrics: they report
// nothing) and what stops the server.
func withMetrics(addr string, log io.Writer) (observe.Observer, func(), error) {
	if addr == "" {
		return nil, func() {}, nil
	}
	m := &promtext.Counts{}
	stop, err := serveMetrics(addr, m, log)
	if err != nil {
		return nil, nil, err
	}
	return m, stop, nil
}

// serveMetrics serves m at addr's /metrics until stop is called. It
// returns once the address is listening, so a scrape right after works.
func serveMetrics(addr string, m *promtext.Counts, log io.Writer) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m)
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
