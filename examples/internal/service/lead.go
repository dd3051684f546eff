package service

import (
	"context"
	"sync/atomic"
	"time"
)

// Lock is what Leader needs of a held lock: a *lease.Lock or a
// *dynamolock.Lock.
type Lock interface {
	Token() int64
	Lost() <-chan struct{}
	Context() context.Context // cancelled when the lock is lost
	Err() error
	Release(ctx context.Context) error
}

// Leader runs a job on the replica that holds its lock: Acquire waits for
// the lock, and Step runs every interval while it is held.
type Leader struct {
	// Acquire waits for the job's lock until ctx ends.
	Acquire func(ctx context.Context) (Lock, error)
	// Step does one unit of the job, fenced by token. Its ctx ends when
	// the lock is lost, not when the service stops, so the step in hand
	// finishes. Fenced reports an error that says a newer holder wrote:
	// the replica stops leading then.
	Step   func(ctx context.Context, token int64) error
	Fenced func(err error) bool
	Every  time.Duration

	token atomic.Int64 // while leading, else 0
	steps atomic.Int64 // steps that succeeded
}

// LeaderStatus is what /leader answers.
type LeaderStatus struct {
	Leader bool  `json:"leader"`
	Token  int64 `json:"token,omitempty"`
	Steps  int64 `json:"steps"` // steps this replica did
}

// Status says whether this replica leads, with which token, and how many
// steps it did.
func (l *Leader) Status() LeaderStatus {
	t := l.token.Load()
	return LeaderStatus{Leader: t > 0, Token: t, Steps: l.steps.Load()}
}

// Lead runs l in the background (see Go): wait for the lock, step while
// it is held, wait again; on stop, finish the step in hand and release
// the lock, so the next replica takes over at once.
func (s *Service) Lead(l *Leader) {
	s.Go("leader", func(ctx context.Context) error {
		for {
			lock, err := l.Acquire(ctx)
			if err == nil {
				l.lead(ctx, s, lock)
			}
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				s.Log.Warn("acquire", "err", err)
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		}
	})
}

// lead steps every interval until ctx ends or the lock is lost, then
// releases the lock.
func (l *Leader) lead(ctx context.Context, s *Service, lock Lock) {
	l.token.Store(lock.Token())
	s.Log.Info("leading", "token", lock.Token())
	defer l.release(ctx, s, lock)
	t := time.NewTicker(l.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lock.Lost():
			s.Log.Warn("lock lost", "err", lock.Err())
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(lock.Context(), 10*time.Second)
		err := l.Step(sctx, lock.Token())
		cancel()
		switch {
		case err != nil && l.Fenced(err):
			s.Log.Warn("fenced: a newer leader has written", "token", lock.Token(), "err", err)
			return
		case err != nil:
			s.Log.Warn("step", "err", err)
		default:
			l.steps.Add(1)
		}
	}
}

func (l *Leader) release(ctx context.Context, s *Service, lock Lock) {
	l.token.Store(0)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := lock.Release(rctx); err != nil {
		s.Log.Warn("release", "err", err)
		return
	}
	s.Log.Info("released", "token", lock.Token())
}
