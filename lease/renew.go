package lease

import (
	"context"
	"errors"
	"time"

	"github.com/nolock/nolock/internal/backoff"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/internal/pgerr"
)

// The local deadline. A Lock is valid, on this Client's clock, until a
// lease after the moment its last confirmed statement was sent (or, after
// an answer was lost, until the time left that a read of the row reports,
// counted from when the read was sent). The database starts its lease when
// it runs the statement, after it was sent, so the holder always believes
// it holds the lock for less time than the database grants it: when the
// holder's deadline passes (Lost), the row may still be live, never the
// other way round, as long as the two clocks run at the same rate.

// backend is what the lock core needs from a Client: its statements.
type backend struct{ c *Client }

// Renew extends the leases of hs with one statement, which the core
// bounds. A lock it renews is confirmed; one it renews nothing for, or
// every one when the answer was lost, is resolved by reading the rows
// (one statement): if a row is still ours and live, the time the read
// reports left is the validity (whether the renewal applied or not); if
// it is not, the lock is lost (taken over, released, or expired on the
// database's clock). A statement that did not apply, or whose answer did
// not come in time, fails every lock of the batch: the next renewal
// decides.
func (b backend) Renew(ctx context.Context, hs []*lockcore.Hold) []lockcore.Renewed {
	c := b.c
	at := c.cfg.Now()
	out := make([]lockcore.Renewed, len(hs))
	keys, tokens := make([]string, len(hs)), make([]int64, len(hs))
	for i, h := range hs {
		keys[i], tokens[i] = h.Key, h.Token
	}
	var rkeys []string
	var rtokens []int64
	err := c.pg.Row(ctx, c.db, c.sql.renew, c.over.Args(keys, tokens, micros(c.cfg.Lease))...).Scan(&rkeys, &rtokens)
	if err != nil && (pgerr.Of(err) != pgerr.Unknown || ctx.Err() != nil) {
		for i := range out {
			out[i] = lockcore.Renewed{At: at, Err: err} // not applied, or stopped, or out of time
		}
		return out
	}
	renewed := make(map[row]bool, len(rkeys))
	for i, k := range rkeys {
		renewed[row{key: k, token: rtokens[i]}] = true
	}
	var unsure []string
	for i, h := range hs {
		if err == nil && renewed[row{key: h.Key, token: h.Token}] {
			out[i] = lockcore.Renewed{At: at, Valid: at.Add(c.cfg.Lease)}
		} else {
			unsure = append(unsure, h.Key)
		}
	}
	if len(unsure) == 0 {
		return out
	}
	readAt := c.cfg.Now()
	rows, rerr := c.readAll(ctx, unsure)
	for i, h := range hs {
		if out[i].At.IsZero() {
			out[i] = c.judge(h, at, readAt, rows[h.Key], err, rerr)
		}
	}
	return out
}

// judge resolves a renewal of h sent at at from its row as read at readAt
// (err: the renewal's error; rerr: the read's).
func (c *Client) judge(h *lockcore.Hold, at, readAt time.Time, r row, err, rerr error) lockcore.Renewed {
	switch {
	case rerr != nil && err != nil:
		return lockcore.Renewed{At: at, Err: errfmt.Errorf("%w; reading the row back: %w", err, rerr)}
	case rerr != nil: // renewed nothing: the lock is gone, for a reason the read would have told
		return lockcore.Renewed{At: at, Err: &lockcore.Loss{Cause: lockcore.Expired, Last: rerr}}
	case r.exists && r.token == h.Token && !r.released && r.left > 0:
		return lockcore.Renewed{At: readAt, Valid: readAt.Add(min(r.left, c.cfg.Lease))}
	case r.exists && r.token == h.Token && !r.released:
		return lockcore.Renewed{At: at, Err: &lockcore.Loss{Cause: lockcore.Expired}}
	}
	return lockcore.Renewed{At: at, Err: &lockcore.Loss{Cause: lockcore.TakenOver, Owner: r.owner, Token: r.token}}
}

// Lost returns the *LostError of a loss of h.
func (b backend) Lost(h *lockcore.Hold, loss *lockcore.Loss) error {
	return &LostError{Key: h.Key, Cause: Cause(loss.Cause), Owner: loss.Owner, Token: loss.Token, Last: loss.Last}
}

// Release marks the row released if it carries h's token. A try whose
// answer was lost, or that timed out, is repeated until ctx ends (each
// waits for its answer as lockcore.CallBound says); a try that releases
// nothing reads the row: released with our token means an earlier try
// applied. It returns nil when the row is released with our token, a
// *lockcore.Loss when it carries another token.
func (b backend) Release(ctx context.Context, h *lockcore.Hold) error {
	c := b.c
	bo := backoff.Policy{Base: time.Millisecond, Cap: max(c.cfg.Lease/8, time.Millisecond)}
	cut := false // the last try was cut off at its bound: retry at once, with all the time left
	for try := 1; ; try++ {
		callCtx, cancel := context.WithTimeout(ctx, lockcore.CallBound(ctx, c.cfg.Lease, cut))
		tag, err := c.pg.Exec(callCtx, c.db, c.sql.release, c.over.Args(h.Key, h.Token)...)
		cut = ctx.Err() == nil && callCtx.Err() != nil
		cancel()
		if err == nil && tag.RowsAffected() == 1 {
			return nil
		}
		if err == nil {
			readCtx, cancel := context.WithTimeout(ctx, lockcore.CallBound(ctx, c.cfg.Lease, false))
			r, rerr := c.read(readCtx, h.Key)
			cut = ctx.Err() == nil && readCtx.Err() != nil
			cancel()
			switch {
			case rerr == nil && r.exists && r.token == h.Token && r.released:
				return nil // released, by an earlier try of ours
			case rerr == nil && r.exists && r.token == h.Token:
				// Ours and not released: the try met another server (a
				// failover in between). Release again.
				rerr = errors.New("the row is still held with our token")
			case rerr == nil:
				return &lockcore.Loss{Cause: lockcore.TakenOver, Owner: r.owner, Token: r.token}
			}
			err = rerr
		} else if pgerr.Of(err) == pgerr.Refused && !transient(err) {
			return errfmt.Errorf("lease: release %q: %w", h.Key, err)
		}
		c.k.Log().Debug("lease: release failed; retrying", "key", h.Key, "outcome", pgerr.Of(err), "err", err)
		if cut && ctx.Err() == nil {
			continue
		}
		if serr := backoff.Sleep(ctx, bo.Delay(try)); serr != nil {
			return errfmt.Errorf("lease: release %q: %w (last error: %w)", h.Key, serr, err)
		}
	}
}
