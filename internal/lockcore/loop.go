package lockcore

import (
	"context"
	"errors"
	"slices"
	"time"
)

// The renewal loop: one goroutine per Client renews every lock it holds.
// Each lock has its own deadlines on the Client's clock: the next renewal
// (a heartbeat after the last confirmed one was sent; after a failure, a
// growing backoff), the Expiring warning, the end of its local validity
// and of its maximum hold. The loop wakes at the earliest of them all.
// A renewal runs in a goroutine of its own, so a slow one delays neither
// another lock's deadlines nor its own warning and expiry; a lock never
// has two renewals in flight, and each waits at most three quarters of
// the time its lock (the soonest of a batch) has left, which leaves room
// for one more within the lease when an answer never comes; that one
// waits for all that is left. Deadlines are instants of the clock and
// timers run on the monotonic clock, so a process that resumes after a
// pause finds them passed at once.

// run is the renewal loop; it ends when Close cancels the Keeper.
func (k *Keeper) run() {
	defer k.wg.Done()
	defer close(k.loopDone)
	for {
		wake := k.tick()
		var t *time.Timer
		var tc <-chan time.Time
		if !wake.IsZero() {
			t = time.NewTimer(wake.Sub(k.cfg.Now()))
			tc = t.C
		}
		select {
		case <-k.ctx.Done():
		case <-tc:
		case <-k.nudge:
		case r := <-k.results:
			k.settle(r)
		}
		if t != nil {
			t.Stop()
		}
		if k.ctx.Err() != nil {
			return
		}
	}
}

// tick does what is due for every live lock and starts the renewals that
// are due: in batch mode, once one lock is due, every lock with no renewal
// in flight joins its call, so that the locks of a Client, acquired at
// different moments, renew together from then on, one call per heartbeat.
// It returns the next instant something is due (zero: nothing).
func (k *Keeper) tick() time.Time {
	now := k.cfg.Now()
	k.mu.Lock()
	hs := make([]*Hold, 0, len(k.live))
	for h := range k.live {
		hs = append(hs, h)
	}
	k.mu.Unlock()
	var wake time.Time
	soonest := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	var due, early []*Hold
	for _, h := range hs {
		w, renew, ok := h.check(now)
		if !ok {
			continue
		}
		soonest(w)
		switch {
		case !renew:
		case !now.Before(h.next):
			due = append(due, h)
		case k.cfg.Batch:
			early = append(early, h) // renewed with the due ones: one call per period
			soonest(h.next)
		default:
			soonest(h.next)
		}
	}
	switch {
	case len(due) == 0:
		return wake
	case k.cfg.Batch:
		k.start(append(due, early...), now)
		return now // look again at once: the started locks' wakes changed
	}
	// One call per lock, at most MaxCalls at once, the locks with the
	// least time left first. A due lock left waiting is looked at again
	// when a call answers.
	if room := int(k.window) - k.calls; k.cfg.MaxCalls > 0 && room < len(due) {
		slices.SortFunc(due, func(a, b *Hold) int { return a.ValidUntil().Compare(b.ValidUntil()) })
		for _, h := range due[max(room, 0):] {
			h.held = true
		}
		due = due[:max(room, 0)]
	}
	for _, h := range due {
		k.start([]*Hold{h}, now)
	}
	if len(due) == 0 {
		return wake
	}
	return now
}

// check does what is due for h at now: the end of its maximum hold, the
// warning, the expiry. It returns when h next needs the loop for those
// (its next renewal aside), whether a renewal may start (none is in
// flight), and false if h has ended.
func (h *Hold) check(now time.Time) (wake time.Time, renew, ok bool) {
	k := h.k
	h.mu.Lock()
	valid, warned, c, ended := h.valid, h.warned, h.call, h.err != nil || h.stopping
	h.mu.Unlock()
	if ended {
		return time.Time{}, false, false
	}
	if !h.maxAt.IsZero() && !now.Before(h.maxAt) {
		h.endMaxHold()
		return time.Time{}, false, false
	}
	warnAt := valid.Add(-k.cfg.Warn)
	if !h.maxAt.IsZero() && h.maxAt.Add(-k.cfg.Warn).Before(warnAt) {
		warnAt = h.maxAt.Add(-k.cfg.Warn)
	}
	if !warned && !now.Before(warnAt) {
		h.mu.Lock()
		first := h.warnLocked()
		h.mu.Unlock()
		if first {
			h.event(k.cfg.Events.Expiring, 0, nil)
		}
		warned = true
	}
	if !now.Before(valid) {
		if c != nil && !k.cfg.Batch {
			c.cancel() // its answer no longer matters
		}
		h.end(&Loss{Cause: Expired, Last: k.hung(h, c, now)})
		return time.Time{}, false, false
	}
	wake = valid
	if !h.maxAt.IsZero() && h.maxAt.Before(wake) {
		wake = h.maxAt
	}
	if !warned && warnAt.Before(wake) {
		wake = warnAt
	}
	return wake, c == nil, true
}

// start sends one renewal call for hs in a goroutine of its own. The call
// waits at most three quarters of the time the soonest-expiring of them
// has left: a slow store gets nearly all of it (cutting a call short does
// not stop the store from running it, so an early cut and a retry would
// only add to its load), and the last quarter is left for one retry when
// an answer never comes. That retry (a lock whose last call was cut off)
// waits for all of the time left: none can follow it, and a store that is
// merely slow may still answer it.
func (k *Keeper) start(hs []*Hold, now time.Time) {
	ctx, cancel := context.WithCancel(k.ctx)
	c := &call{at: now, cancel: cancel, done: make(chan struct{})}
	var on []*Hold
	bound := time.Duration(-1)
	for _, h := range hs {
		h.mu.Lock()
		if h.err == nil && !h.stopping && h.call == nil {
			h.call, h.held = c, false
			on = append(on, h)
			wait := callWait(h.valid.Sub(now), h.cut)
			if bound < 0 || wait < bound {
				bound = wait
			}
		}
		h.mu.Unlock()
	}
	if len(on) == 0 {
		cancel()
		close(c.done)
		return
	}
	c.bound = max(bound, time.Millisecond)
	ctx, stop := context.WithTimeout(ctx, c.bound)
	k.calls++
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		rs := k.be.Renew(ctx, on)
		cut := errors.Is(ctx.Err(), context.DeadlineExceeded)
		stop()
		cancel()
		close(c.done)
		select {
		case k.results <- results{c: c, hs: on, rs: rs, cut: cut}:
		case <-k.loopDone:
		}
	}()
}

// CallBound is how long a release call (or the read that resolves it)
// waits for its answer under ctx, by the rule renewal calls follow: three
// quarters of the time ctx has left, or all of it after a call cut off at
// its bound; a lease without a deadline. A slow store gets nearly all the
// time there is, and an answer that never comes leaves a quarter for one
// retry.
func CallBound(ctx context.Context, lease time.Duration, afterCut bool) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return lease
	}
	return max(callWait(time.Until(d), afterCut), time.Millisecond)
}

// callWait is how long a call may wait with left to go: three quarters of
// it, all of it after a call cut off at its bound.
func callWait(left time.Duration, afterCut bool) time.Duration {
	if afterCut {
		return left
	}
	return left - left/4
}

// settle handles a renewal call's answers: a *Loss ends its lock; a
// failure schedules a retry after a growing backoff (at once after a call
// cut off at its bound, whose retry has only the time left, and waits for
// all of it); a confirmed renewal extends the local validity and
// schedules the next a heartbeat after it was sent.
func (k *Keeper) settle(r results) {
	full := k.calls >= int(k.window)
	k.calls--
	now := k.cfg.Now()
	k.adapt(r, now, full)
	for i, h := range r.hs {
		h.mu.Lock()
		if h.call == r.c {
			h.call = nil
		}
		ended := h.err != nil
		h.mu.Unlock()
		if ended {
			continue
		}
		res := r.rs[i]
		var loss *Loss
		switch {
		case errors.As(res.Err, &loss):
			h.end(loss)
		case res.Err != nil:
			h.failures++
			h.last, h.cut = res.Err, r.cut
			h.next = now.Add(k.retry.Delay(h.failures + 2))
			if r.cut {
				h.next = now // cut off at its bound: the last quarter is the retry's, all of it
			}
			k.log.Debug(k.cfg.Prefix+": "+k.cfg.Renewal+" failed; retrying", "key", h.Key, "err", res.Err)
			h.event(k.cfg.Events.RenewFailed, now.Sub(r.c.at), res.Err)
		default:
			h.failures, h.last, h.cut = 0, nil, false
			h.extend(res.Valid)
			h.event(k.cfg.Events.Renewed, now.Sub(res.At), nil)
			h.next = res.At.Add(k.cfg.Heartbeat)
		}
	}
}

// StartCalls is the bound on renewal calls in flight a Keeper starts with
// (at most Config.MaxCalls).
const StartCalls = 8

// adapt moves the Keeper's bound on renewal calls in flight (without
// Batch) after call r answered at now: it halves it, down to StartCalls
// (or MaxCalls if lower), when
// the call took more than a quarter of its time bound or was cut off at
// it, once for the calls sent before that (they met the same queue), and
// raises it by one per bound's worth of calls answered sooner while all
// the calls it allowed were in flight (full), up to MaxCalls. A store
// runs the calls it cannot serve at once in arrival order, so a call
// beyond them waits in its queue, and the wait counts against the call's
// bound; kept in the Keeper, it waits for a call to answer, behind the
// locks with less time left, and costs the store nothing if its lock
// needs it no more. It never goes below StartCalls: a store that stalls
// (paused, or starved of CPU) makes every call slow, not only those
// beyond its queue, and the locks then need every call it can answer
// once it resumes.
func (k *Keeper) adapt(r results, now time.Time, full bool) {
	if k.cfg.Batch || k.cfg.MaxCalls <= 0 {
		return
	}
	switch {
	case r.cut || now.Sub(r.c.at) > r.c.bound/4:
		if r.c.at.After(k.shrunk) {
			k.window = max(k.window/2, float64(min(StartCalls, k.cfg.MaxCalls)))
			k.shrunk = now
		}
	case full:
		k.window = min(k.window+1/k.window, float64(k.cfg.MaxCalls))
	}
}
