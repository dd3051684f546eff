package service

import (
	"context"
	"log/slog"
	"time"
)

// Reap registers a reaper: reap runs at start and then every REAP_INTERVAL
// (default 1m) until the service stops, and returns how many rows it
// deleted. Each run is logged at Info ("reaped", with the reaper's name
// and the count), so an operator sees that retention keeps up; a failed
// run is logged at Warn and tried again at the next interval.
func (s *Service) Reap(name string, reap func(ctx context.Context) (int64, error)) {
	s.reapers = append(s.reapers, reaper{name, reap})
}

type reaper struct {
	name string
	reap func(ctx context.Context) (int64, error)
}

func (r reaper) run(ctx context.Context, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n, err := r.reap(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("reap failed", "reaper", r.name, "err", err)
		default:
			log.Info("reaped", "reaper", r.name, "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
