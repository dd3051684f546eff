package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
)

// A call that meets its key held by a request in flight waits for it
// holding no connection: a connection is held only for an attempt, a
// claim that finds the key's lock taken ends its transaction at once
// (errBusy), and the call pauses before its next attempt (awaitKey). A
// call of the same Store with the key in flight is waited for in the
// process (queueKey), so that the Store's duplicates of one key do not
// each poll the database.

// errBusy means that a request in flight holds the key: the attempt
// ended its transaction and released its connection, and is made again
// after a pause.
var errBusy = errors.New("idempotency: the key is held by a request in flight")

// queueKey waits, at most until wait has passed since start (0: until ctx
// ends), for the call of this Store that has (scope, key) in flight, if
// there is one, and returns ErrInProgress if it is still running then.
// Otherwise the call becomes the one in flight, until leave. A call that
// waited (waited true) makes its attempts beside any other (the database
// decides); it does not hold up later calls.
func (s *Store) queueKey(ctx context.Context, scope, key string, start time.Time, wait time.Duration) (leave func(), waited bool, err error) {
	k := keyOf(scope, key)
	s.keysMu.Lock()
	held, ok := s.keys[k]
	if !ok {
		mine := make(chan struct{})
		s.keys[k] = mine
		s.keysMu.Unlock()
		return func() {
			s.keysMu.Lock()
			delete(s.keys, k)
			s.keysMu.Unlock()
			close(mine)
		}, false, nil
	}
	s.keysMu.Unlock()
	s.busy.Add(1)
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(max(wait-time.Since(start), 0))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-held:
		return func() {}, true, nil
	case <-timeout:
		return nil, false, errfmt.Errorf("%w: key %q, waited %v", ErrInProgress, key, wait)
	case <-ctx.Done():
		return nil, false, errfmt.Errorf("%w: key %q: %w", ErrInProgress, key, context.Cause(ctx))
	}
}

// keyOf is (scope, key) as one map key: the scope's length first, as the
// key's lock is named.
func keyOf(scope, key string) string {
	return string(rune(len(scope))) + scope + "\x00" + key
}

// mayBeFree reports whether (scope, key) has a live record or its lock is
// free, with probeSQL: one round trip, outside a transaction, so that a
// call waiting for another process's request polls cheaply before it makes
// an attempt. Inside the caller's transaction (viaTx), where the lock
// would stay taken, and after an error, it reports true: the attempt
// then decides.
func (s *Store) mayBeFree(ctx context.Context, scope, key string) bool {
	if s.via == viaTx {
		return true
	}
	var free bool
	err := s.onDB(ctx, func(ctx context.Context) error {
		return s.over.QueryRow(ctx, s.db, s.probeSQL, scope, key).Scan(&free)
	})
	return err != nil || free
}

// awaitKey pauses a call that found its key held for the n-th time, with
// no connection held, and returns ErrInProgress when the call has waited
// wait since start (0: until ctx ends) or ctx ends first.
func (s *Store) awaitKey(ctx context.Context, key string, n int, start time.Time, wait time.Duration) error {
	s.busy.Add(1)
	pause := s.poll.Delay(n + 1)
	if wait > 0 {
		left := wait - time.Since(start)
		if left <= 0 {
			return errfmt.Errorf("%w: key %q, waited %v", ErrInProgress, key, wait)
		}
		pause = min(pause, left)
	}
	if backoff.Sleep(ctx, pause) != nil {
		return errfmt.Errorf("%w: key %q: %w", ErrInProgress, key, context.Cause(ctx))
	}
	return nil
}
