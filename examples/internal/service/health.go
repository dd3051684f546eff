package service

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Health checks run every checkEvery, each bounded by checkTimeout; a
// dependency is healthy while its check succeeded within staleAfter.
const (
	checkEvery   = 2 * time.Second
	checkTimeout = 2 * time.Second
	staleAfter   = 3 * checkEvery
)

// Check registers a health check: a cheap call that proves a dependency
// answers (a ping, a metadata request, never a write). /healthz answers
// 200 while every check succeeded within the last few seconds, 503
// otherwise, with each check's last success in its body.
func (s *Service) Check(name string, check func(ctx context.Context) error) {
	s.health.fns = append(s.health.fns, namedCheck{name, check})
}

type namedCheck struct {
	name  string
	check func(ctx context.Context) error
}

// health holds the checks and when each last succeeded.
type health struct {
	fns    []namedCheck
	mu     sync.Mutex
	checks map[string]time.Time // last success
}

// run runs every check every checkEvery until ctx ends.
func (h *health) run(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(checkEvery)
	defer t.Stop()
	for {
		for _, c := range h.fns {
			cctx, cancel := context.WithTimeout(ctx, checkTimeout)
			err := c.check(cctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				log.Warn("health check failed", "check", c.name, "err", err)
				continue
			}
			h.mu.Lock()
			h.checks[c.name] = time.Now()
			h.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serve answers /healthz.
func (h *health) serve(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	ok := true
	body := map[string]string{}
	for _, c := range h.fns {
		last, seen := h.checks[c.name]
		switch {
		case !seen:
			ok = false
			body[c.name] = "no answer yet"
		case time.Since(last) > staleAfter:
			ok = false
			body[c.name] = "last answered " + time.Since(last).Round(time.Second).String() + " ago"
		default:
			body[c.name] = "ok"
		}
	}
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}
