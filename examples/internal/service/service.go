// Package service is the scaffolding the example services share, so that
// each service's main is mostly its pattern: configuration from the
// environment, signals, /healthz, /metrics, reapers on an interval, and
// a graceful stop.
//
// A service's main calls New, Require for the variables it cannot do
// without, sets up its clients (pgservice.Pool, Brokers, the AWS SDK's
// config), registers its handlers (Handle), health checks (Check), reapers
// (Reap), background work (Go, Lead) and what to close at the end
// (OnStop), then calls Run, which does not return. The package links no
// database client: a service links only the ones it uses.
//
// Run serves on ADDR (default :8080) until SIGTERM or SIGINT, then stops in
// this order: the HTTP server stops accepting and waits for the requests
// in flight (http.Server.Shutdown, up to STOP_TIMEOUT, default 30s); the
// background work's context ends and Run waits for it (a consumer's batch
// in flight commits, a leader releases its lease); the reapers and health
// checks stop; what OnStop registered is closed, last first. It exits 0
// when all of that went well, 1 when something failed, and 2, before
// anything starts, when a required variable is missing or a setting is
// invalid.
package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nolock/nolock/internal/promtext"
	"github.com/nolock/nolock/observe"
)

// Service is one example service's process. Its methods are for main's
// goroutine, before Run.
type Service struct {
	name        string
	Log         *slog.Logger
	ctx         context.Context // ends on SIGTERM or SIGINT
	stop        context.CancelFunc
	mux         *http.ServeMux
	metrics     promtext.Counts
	health      health
	reapers     []reaper
	workers     []worker
	closers     []func() error
	reapEvery   time.Duration // REAP_INTERVAL: how often the reapers run
	addr        string        // ADDR
	stopTimeout time.Duration // STOP_TIMEOUT
}

// New starts a service named name (its log lines carry it): it reads
// ADDR, REAP_INTERVAL and STOP_TIMEOUT (exiting 2 if one is invalid),
// logs to stderr, and catches SIGTERM and SIGINT from now on, so a signal
// while setting up ends Context.
func New(name string) *Service {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	s := &Service{
		name: name,
		Log:  slog.New(slog.NewTextHandler(os.Stderr, nil)).With("service", name),
		ctx:  ctx, stop: stop, mux: http.NewServeMux(),
	}
	s.reapEvery = s.Duration("REAP_INTERVAL", time.Minute)
	s.addr = s.Env("ADDR", ":8080")
	s.stopTimeout = s.Duration("STOP_TIMEOUT", 30*time.Second)
	s.health.checks = map[string]time.Time{}
	s.mux.Handle("GET /metrics", &s.metrics)
	s.mux.HandleFunc("GET /healthz", s.health.serve)
	return s
}

// Context ends when the service is asked to stop (SIGTERM, SIGINT): the
// context for setting up, before Run.
func (s *Service) Context() context.Context { return s.ctx }

// Observer is what the service gives the library's WithObserver options:
// the events it counts for /metrics.
func (s *Service) Observer() observe.Observer { return &s.metrics }

// Require exits 2, with a line naming them, unless every variable in names
// is set.
func (s *Service) Require(names ...string) {
	var missing []string
	for _, name := range names {
		if os.Getenv(name) == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		s.Usage("%s not set", strings.Join(missing, ", "))
	}
}

// Env returns the variable name's value, or def when it is unset.
func (s *Service) Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Duration returns the variable name parsed as a time.Duration ("30s"), or
// def when it is unset; it exits 2 when the value is not a positive
// duration.
func (s *Service) Duration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		s.Usage("%s=%q: want a positive duration such as 30s", name, v)
	}
	return d
}

// Usage prints what is wrong with the configuration and exits 2.
func (s *Service) Usage(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s: %s\n", s.name, fmt.Sprintf(format, args...))
	os.Exit(2)
}

// Fatal logs err, closes what was set up, and exits 1: for a failure
// while setting up.
func (s *Service) Fatal(err error) {
	s.Log.Error("cannot start", "err", err)
	s.closeAll()
	os.Exit(1)
}

// Handle serves pattern (http.ServeMux's syntax) with h.
func (s *Service) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// HandleFunc serves pattern with f.
func (s *Service) HandleFunc(pattern string, f http.HandlerFunc) { s.mux.Handle(pattern, f) }

// OnStop registers close to run at the end, after the HTTP server and the
// background work stopped; the last registered runs first.
func (s *Service) OnStop(close func() error) { s.closers = append(s.closers, close) }

// Go runs work in the background from Run on. Its context ends when the
// service stops; work should finish what it has in hand and return nil.
// Work that returns an error (not its context's) stops the service, which
// then exits 1.
func (s *Service) Go(name string, work func(ctx context.Context) error) {
	s.workers = append(s.workers, worker{name, work})
}

type worker struct {
	name string
	work func(ctx context.Context) error
}

// Run serves and runs everything registered until the service is asked to
// stop or background work fails, stops everything as the package doc says,
// and exits.
func (s *Service) Run() {
	os.Exit(s.run())
}

func (s *Service) run() int {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		s.Log.Error("cannot listen", "addr", s.addr, "err", err)
		s.closeAll()
		return 1
	}
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 10 * time.Second}
	bg, cancel := context.WithCancel(context.Background())
	defer cancel()
	var loops, work sync.WaitGroup
	loops.Go(func() { s.health.run(bg, s.Log) })
	for _, r := range s.reapers {
		loops.Go(func() { r.run(bg, s.reapEvery, s.Log) })
	}
	failed := make(chan error, len(s.workers)+1)
	for _, w := range s.workers {
		work.Go(func() {
			if err := w.work(bg); err != nil && bg.Err() == nil {
				failed <- fmt.Errorf("%s: %w", w.name, err)
			}
		})
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			failed <- fmt.Errorf("http: %w", err)
		}
	}()
	s.Log.Info("listening", "addr", ln.Addr().String())

	code := 0
	select {
	case <-s.ctx.Done():
		s.Log.Info("stopping: signal received")
	case err := <-failed:
		s.Log.Error("stopping", "err", err)
		code = 1
	}
	s.stop() // a second signal now ends the process at once
	ctx, cancelStop := context.WithTimeout(context.Background(), s.stopTimeout)
	defer cancelStop()
	if err := srv.Shutdown(ctx); err != nil {
		s.Log.Error("requests in flight did not finish", "err", err)
		code = 1
	}
	<-served
	cancel()
	work.Wait()
	loops.Wait()
	close(failed)
	for err := range failed {
		s.Log.Error("background work failed", "err", err)
		code = 1
	}
	if !s.closeAll() {
		code = 1
	}
	s.Log.Info("stopped", "exit", code)
	return code
}

// closeAll runs the OnStop functions, last first, and reports whether all
// of them succeeded.
func (s *Service) closeAll() bool {
	ok := true
	for i := len(s.closers) - 1; i >= 0; i-- {
		if err := s.closers[i](); err != nil {
			s.Log.Error("close", "err", err)
			ok = false
		}
	}
	s.closers = nil
	return ok
}
