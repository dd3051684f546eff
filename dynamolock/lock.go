package dynamolock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/internal/backoff"
)

// The algorithm, in one place.
//
// A lock is an item. Acquiring writes it with one conditional UpdateItem:
// the item is absent, or released, or (takeover) still carries the record
// version number (RVN) this client has seen unchanged for a full lease of
// its own monotonic clock. The same write adds 1 to the fencing token and
// returns it. A holder's heartbeat writes a new random RVN conditional on
// its own; release writes one more, marks the item released, and keeps it
// (the token must never restart). No wall-clock instant is stored or
// compared: only this process's elapsed time counts.
//
// Every write carries an RVN generated before it is sent, so a write whose
// answer is lost (a timeout, a 5xx, a condition that failed because the
// SDK retried a write that had applied) is resolved by reading the item: if
// it holds one of our RVNs, the write applied, and the lock is valid from
// the moment that write was sent. Local validity is only ever extended by
// a write known to have applied.

// AcquireOption configures one Acquire or TryAcquire.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	key, sortKey string
	wait         time.Duration // 0: until ctx ends
	maxHold      time.Duration // 0: no limit
	data         []byte
}

// WithWait bounds how long Acquire waits for a held lock, or retries while
// DynamoDB calls fail (it must be positive). When it passes, Acquire
// returns a *HeldError if it last saw the lock held, or an error wrapping
// the last DynamoDB error if calls were failing. Without it, Acquire waits
// until its context ends. A single call that hangs is cut off after at
// most a lease, so it can overrun the wait by up to that. A dead holder's lock can only be
// taken over after one lease of waiting, so a wait shorter than the
// holder's lease only ever gets a lock that is free or released meanwhile.
func WithWait(d time.Duration) AcquireOption { return func(a *acquireConfig) { a.wait = d } }

// WithMaxHold bounds the lock's total hold: when d has passed since the
// acquiring write was sent, the lock stops heartbeating, Lost is closed
// (a *LostError with Cause MaxHold) and the item is released. A hung holder
// (stuck in a loop while its heartbeat goroutine keeps running) cannot keep
// the lock forever. It must be positive; the default is no limit.
func WithMaxHold(d time.Duration) AcquireOption { return func(a *acquireConfig) { a.maxHold = d } }

// WithSortKey sets the lock's sort key value, required when the Client has
// a sort key name (WithSortKeyName), refused otherwise.
func WithSortKey(value string) AcquireOption { return func(a *acquireConfig) { a.sortKey = value } }

// WithData stores a payload (at most MaxDataLen bytes) on the lock item for
// as long as the lock is held, for other clients to read (HeldError.Data).
// Without it, an acquisition removes the previous holder's data.
func WithData(data []byte) AcquireOption {
	return func(a *acquireConfig) { a.data = append([]byte(nil), data...) }
}

func (c *Client) acquireConfig(key string, opts []AcquireOption) (acquireConfig, error) {
	ac := acquireConfig{key: key}
	for _, o := range opts {
		if o != nil {
			o(&ac)
		}
	}
	switch {
	case key == "":
		return ac, invalid("key is empty")
	case len(key) > MaxKeyLen:
		return ac, invalid("key is %d bytes, more than %d", len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return ac, invalid("key %q is not valid UTF-8 (DynamoDB would store U+FFFD for the bad bytes, merging distinct keys)", key)
	case !utf8.ValidString(ac.sortKey):
		return ac, invalid("sort key %q is not valid UTF-8 (DynamoDB would store U+FFFD for the bad bytes, merging distinct keys)", ac.sortKey)
	case c.cfg.skName != "" && ac.sortKey == "":
		return ac, invalid("sort key is empty; the table's sort key %q needs a value (WithSortKey)", c.cfg.skName)
	case c.cfg.skName == "" && ac.sortKey != "":
		return ac, invalid("sort key %q given, but the Client has no sort key name (WithSortKeyName)", ac.sortKey)
	case len(ac.sortKey) > MaxSortKeyLen:
		return ac, invalid("sort key is %d bytes, more than %d", len(ac.sortKey), MaxSortKeyLen)
	case ac.wait < 0:
		return ac, invalid("wait %v is negative", ac.wait)
	case ac.maxHold < 0:
		return ac, invalid("max hold %v is negative", ac.maxHold)
	case len(ac.data) > MaxDataLen:
		return ac, invalid("data is %d bytes, more than %d", len(ac.data), MaxDataLen)
	}
	if len(ac.data) == 0 {
		ac.data = nil
	}
	return ac, nil
}

// Acquire takes the lock named key, waiting while someone else holds it.
// It returns when the lock is taken; when the wait limit passes (a
// *HeldError wrapping ErrNotAcquired, or the last DynamoDB error if calls
// were failing; see WithWait); when ctx ends (an error wrapping ctx.Err()
// and, if the last call failed, its DynamoDB error); or when the Client is
// closed (ErrClosed). Keys and sort keys must be valid UTF-8 (DynamoDB
// would merge keys that differ only in invalid bytes): others are refused
// with ErrInvalid before any I/O.
//
// A free or released lock costs one conditional write. A held one is read
// every poll period; if its record version number stays unchanged for a
// full lease of the holder (as stored on the item) on this Client's own
// clock, the holder is presumed dead and the lock is taken over, with a
// write conditional on that version. So a live holder is never displaced,
// and a dead one's lock is taken over one lease to one lease plus one poll
// after its last heartbeat. Waiters are not served in order.
//
// The returned Lock heartbeats in the background until Release, Close, the
// maximum hold, or its loss. A write whose answer was lost is resolved by
// reading the item back; if Acquire gives up with such a write outstanding,
// a background goroutine (which Close waits for) releases the item in case
// the write applied.
func (c *Client) Acquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, false)
}

// TryAcquire takes the lock named key if it is free, released, or held by
// a holder this Client has seen dead: its record version number unchanged
// for a full lease since this Client first saw it (the first sightings are
// kept in a bounded cache, so calling TryAcquire periodically eventually
// takes over a dead holder's lock without comparing any clocks). Otherwise
// it returns a *HeldError wrapping ErrNotAcquired at once. It costs one
// conditional write, plus one read when the lock is held and the server
// does not return the item with a failed condition. When DynamoDB fails
// three calls in a row (a write and two reads, with a short backoff
// between them), it gives up with an error wrapping the last failure; a
// write of those that may have applied is released in the background (if
// DynamoDB stays down, the item stays held by nobody until a waiter takes
// it over, a lease later). A call that hangs instead of failing is cut off
// only after a lease, so TryAcquire can then take up to three leases.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, key, opts, true)
}

// sent is a write this client sent, with the RVN it carried and when.
type sent struct {
	rvn string
	at  time.Time
}

func newRVN() string { return rand.Text() }

// once turns the SDK's retries off for one conditional write.
func once(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

func (c *Client) acquire(ctx context.Context, key string, opts []AcquireOption, try bool) (*Lock, error) {
	ac, err := c.acquireConfig(key, opts)
	if err != nil {
		return nil, err
	}
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.ctx, cancel)()

	name := lockName(ac.key, ac.sortKey)
	id := ac.key + "\x00" + ac.sortKey
	bo := backoff.Policy{Base: max(c.cfg.poll/16, time.Millisecond), Cap: c.cfg.poll}
	start := c.cfg.now()
	var (
		ours      []sent // our writes that may have applied
		ambiguous bool   // one of them has an unknown outcome
		takeover  *string
		read      bool  // read the item instead of writing
		failed    int   // writes in a row that did not take the lock
		lastErr   error // the last call's DynamoDB error; nil after a call that worked
		errs      int   // calls in a row that failed with a DynamoDB error
	)
	var deadline time.Time // the wait's end, if any
	if ac.wait > 0 {
		deadline = start.Add(ac.wait)
	}
	giveUp := func(err error) (*Lock, error) {
		if ambiguous {
			c.cleanup(ac, ours)
		}
		var held *HeldError
		switch {
		case c.ctx.Err() != nil:
			return nil, ErrClosed
		case errors.As(err, &held):
			return nil, held
		case lastErr != nil && !errors.Is(err, lastErr):
			return nil, fmt.Errorf("dynamolock: acquire %s: %w (last DynamoDB error: %w)", name, err, lastErr)
		}
		return nil, fmt.Errorf("dynamolock: acquire %s: %w", name, err)
	}
	// failing records a DynamoDB error and says whether to give up: for
	// TryAcquire after a few calls in a row (a write and two reads), for a
	// bounded Acquire once its wait has passed.
	failing := func(err error) error {
		lastErr = err
		errs++
		switch {
		case try && errs >= 3:
			return fmt.Errorf("%d DynamoDB calls in a row failed: %w", errs, err)
		case !deadline.IsZero() && !c.cfg.now().Before(deadline):
			return fmt.Errorf("wait of %v passed while DynamoDB calls failed: %w", ac.wait, err)
		}
		return nil
	}
	// pause waits d, or until the wait's end if that comes first.
	pause := func(d time.Duration) error {
		if !deadline.IsZero() {
			d = min(d, deadline.Sub(c.cfg.now()))
		}
		return backoff.Sleep(ctx, d)
	}
	for {
		if err := ctx.Err(); err != nil {
			return giveUp(err)
		}
		var item map[string]types.AttributeValue
		if !read {
			if err := pause(bo.Delay(failed + 1)); err != nil {
				return giveUp(err)
			}
			s := sent{rvn: newRVN(), at: c.cfg.now()}
			ours = append(ours, s)
			if len(ours) > maxPending {
				ours = ours[1:] // an older write that applies late is treated as anyone's: safe
			}
			out, err := c.writeAcquire(ctx, ac, s.rvn, takeover)
			if err == nil {
				tok, _ := strconv.ParseInt(numAttr(out.Attributes, AttrToken), 10, 64)
				return c.newLock(ac, s, tok)
			}
			failed++
			it, ccf := conditionFailed(err)
			switch {
			case ccf:
				item = it
				lastErr, errs = nil, 0
			case permanent(err):
				ours = ours[:len(ours)-1]
				return giveUp(err)
			default:
				ambiguous = true
				c.log.Debug("dynamolock: acquire write outcome unknown; reading the item", "lock", name, "err", err)
				if ctx.Err() != nil {
					return giveUp(ctx.Err())
				}
				if stop := failing(err); stop != nil {
					return giveUp(stop)
				}
			}
		}
		if item == nil {
			it, err := c.get(ctx, ac)
			if err != nil {
				if ctx.Err() != nil {
					return giveUp(ctx.Err())
				}
				if permanent(err) {
					return giveUp(err)
				}
				c.log.Debug("dynamolock: read failed", "lock", name, "err", err)
				if stop := failing(err); stop != nil {
					return giveUp(stop)
				}
				read = true
				wait := jitter(c.cfg.poll)
				if try {
					wait = bo.Delay(errs + 2)
				}
				if err := pause(wait); err != nil {
					return giveUp(err)
				}
				continue
			}
			item = it
			lastErr, errs = nil, 0
		}
		seenAt := c.cfg.now()
		rec := parseItem(item)
		read = false

		// One of our writes applied (its answer was lost, or the condition
		// failed on a retry of it).
		if s, ok := find(ours, rec.rvn); ok && rec.exists && !rec.released {
			if seenAt.Sub(s.at) < c.cfg.lease {
				return c.newLock(ac, s, rec.token)
			}
			takeover = &rec.rvn // ours, but its lease is spent: renew it with a fresh write
			continue
		}
		if !rec.exists || rec.released {
			c.seen.forget(id)
			takeover = nil
			if try && failed >= 3 { // the lock keeps changing hands: stay non-blocking
				return giveUp(&HeldError{Key: ac.key, SortKey: ac.sortKey, Owner: rec.owner, Lease: rec.lease})
			}
			continue
		}
		first := c.seen.observe(id, rec.rvn, seenAt)
		lease := rec.lease
		if lease == 0 {
			lease = c.cfg.lease
		}
		expires := first.Add(lease)
		if !seenAt.Before(expires) {
			takeover = &rec.rvn
			c.log.Debug("dynamolock: taking over a lock unchanged for a lease", "lock", name, "owner", rec.owner, "lease", lease)
			continue
		}
		held := &HeldError{Key: ac.key, SortKey: ac.sortKey, Owner: rec.owner, Lease: lease, Data: rec.data}
		if try {
			return giveUp(held)
		}
		wake := seenAt.Add(jitter(c.cfg.poll))
		if expires.Before(wake) {
			wake = expires
		}
		if !deadline.IsZero() {
			if !seenAt.Before(deadline) {
				return giveUp(held)
			}
			if deadline.Before(wake) {
				wake = deadline
			}
		}
		if err := backoff.Sleep(ctx, wake.Sub(seenAt)); err != nil {
			return giveUp(err)
		}
		read = true
		failed = 0
	}
}

// jitter returns a uniform duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

func find(ss []sent, rvn string) (sent, bool) {
	for _, s := range ss {
		if s.rvn == rvn && rvn != "" {
			return s, true
		}
	}
	return sent{}, false
}

func numAttr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberN); ok {
		return v.Value
	}
	return ""
}

func (c *Client) itemKey(ac acquireConfig) map[string]types.AttributeValue {
	k := map[string]types.AttributeValue{c.cfg.pkName: str(ac.key)}
	if c.cfg.skName != "" {
		k[c.cfg.skName] = str(ac.sortKey)
	}
	return k
}

// writeAcquire sends the acquiring write: the item absent or released, or
// (takeover != nil) still at the RVN *takeover.
func (c *Client) writeAcquire(ctx context.Context, ac acquireConfig, rvn string, takeover *string) (*dynamodb.UpdateItemOutput, error) {
	names := map[string]string{"#pk": c.cfg.pkName, "#own": AttrOwner, "#rvn": AttrRVN, "#lease": AttrLease,
		"#rel": AttrReleased, "#tok": AttrToken, "#data": AttrData}
	values := map[string]types.AttributeValue{":own": str(c.cfg.owner), ":rvn": str(rvn),
		":lease": str(formatLease(c.cfg.lease)), ":relv": str(releasedValue), ":one": num(1)}
	update := "SET #own = :own, #rvn = :rvn, #lease = :lease"
	remove := " REMOVE #rel"
	if ac.data != nil {
		update += ", #data = :data"
		values[":data"] = &types.AttributeValueMemberB{Value: ac.data}
	} else {
		remove += ", #data"
	}
	update += remove + " ADD #tok :one"
	cond := "attribute_not_exists(#pk) OR #rel = :relv"
	if takeover != nil {
		if *takeover == "" {
			cond += " OR attribute_not_exists(#rvn)"
		} else {
			cond += " OR #rvn = :old"
			values[":old"] = str(*takeover)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.lease)
	defer cancel()
	return c.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(c.table), Key: c.itemKey(ac),
		UpdateExpression: aws.String(update), ConditionExpression: aws.String(cond),
		ExpressionAttributeNames: names, ExpressionAttributeValues: values,
		ReturnValues:                        types.ReturnValueUpdatedNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, once)
}

// get reads the lock item with a strongly consistent read (nil if absent).
func (c *Client) get(ctx context.Context, ac acquireConfig) (map[string]types.AttributeValue, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.lease)
	defer cancel()
	out, err := c.api.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(c.table), Key: c.itemKey(ac), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}

// cleanup releases, in the background, an item that one of ours (writes
// whose outcome is unknown) may have taken, after Acquire gave up.
func (c *Client) cleanup(ac acquireConfig, ours []sent) {
	c.mu.Lock()
	c.wg.Add(1) // even when closed: Close waits for it
	c.mu.Unlock()
	rvns := make([]string, len(ours))
	for i, s := range ours {
		rvns[i] = s.rvn
	}
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
		defer cancel()
		if err := c.writeRelease(ctx, ac, rvns); err != nil && !errors.Is(err, ErrLockLost) {
			c.log.Debug("dynamolock: cleanup after a given-up acquisition failed", "lock", lockName(ac.key, ac.sortKey), "err", err)
		}
	}()
}

// writeRelease releases the item if it carries one of rvns: with fencing,
// it marks the item released under a fresh RVN (kept in the condition, so
// a retry after a lost answer succeeds again); without, it deletes it.
// Ambiguous failures are retried until ctx ends. A refused condition means
// another client owns the item: a *LostError.
func (c *Client) writeRelease(ctx context.Context, ac acquireConfig, rvns []string) error {
	name := lockName(ac.key, ac.sortKey)
	rel := newRVN()
	bo := backoff.Policy{Base: max(c.cfg.poll/16, time.Millisecond), Cap: c.cfg.poll}
	unknown := false
	for attempt := 1; ; attempt++ {
		if err := backoff.Sleep(ctx, bo.Delay(attempt)); err != nil {
			return fmt.Errorf("dynamolock: release %s: %w", name, err)
		}
		names := map[string]string{"#rvn": AttrRVN}
		values := map[string]types.AttributeValue{}
		var err error
		wctx, cancel := context.WithTimeout(ctx, c.cfg.releaseTimeout())
		if c.cfg.fencing {
			names["#rel"] = AttrReleased
			values[":relv"] = str(releasedValue)
			values[":new"] = str(rel)
			_, err = c.api.UpdateItem(wctx, &dynamodb.UpdateItemInput{
				TableName: aws.String(c.table), Key: c.itemKey(ac),
				UpdateExpression:         aws.String("SET #rel = :relv, #rvn = :new"),
				ConditionExpression:      aws.String(rvnIn(append(rvns[:len(rvns):len(rvns)], rel), values)),
				ExpressionAttributeNames: names, ExpressionAttributeValues: values,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}, once)
		} else {
			_, err = c.api.DeleteItem(wctx, &dynamodb.DeleteItemInput{
				TableName: aws.String(c.table), Key: c.itemKey(ac),
				ConditionExpression:      aws.String(rvnIn(rvns, values)),
				ExpressionAttributeNames: names, ExpressionAttributeValues: values,
				ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
			}, once)
		}
		cancel()
		if err == nil {
			return nil
		}
		item, ccf := conditionFailed(err)
		if !ccf {
			if permanent(err) {
				return fmt.Errorf("dynamolock: release %s: %w", name, err)
			}
			unknown = true
			c.log.Debug("dynamolock: release outcome unknown; retrying", "lock", name, "err", err)
			continue
		}
		if item == nil {
			rctx, cancel := context.WithTimeout(ctx, c.cfg.releaseTimeout())
			item, err = c.get(rctx, ac)
			cancel()
			if err != nil {
				unknown = true
				continue
			}
		}
		rec := parseItem(item)
		switch {
		case c.cfg.fencing && rec.rvn == rel:
			return nil // an earlier attempt applied
		case !c.cfg.fencing && !rec.exists && unknown:
			return nil // presumably ours applied; see WithoutFencing
		}
		return &LostError{Key: ac.key, SortKey: ac.sortKey, Cause: TakenOver, Owner: rec.owner}
	}
}

// Lock is a held lock. It heartbeats in the background until Release or
// Close, its maximum hold, or its loss, which closes Lost.
//
// A Lock is a lease: a holder paused past it (a GC pause, a stopped VM)
// wakes up still running its code, and Lost is closed only when its own
// goroutine runs again. To keep such a holder from corrupting what the lock
// protects, make the protected store check the fencing token (Token,
// Fence, ConditionCheck, or conditional.Fenced on PostgreSQL). Methods are
// safe for concurrent use.
type Lock struct {
	c       *Client
	ac      acquireConfig
	token   int64
	start   time.Time // when the acquiring write was sent
	stopHB  context.CancelFunc
	done    chan struct{} // closed when the heartbeat goroutine has ended
	stopped sync.Once

	lost, expiring chan struct{}
	ctx            context.Context
	cancelCtx      context.CancelCauseFunc

	mu         sync.Mutex
	rvn        sent   // the last write known to have applied
	pending    []sent // later writes whose outcome is unknown
	validUntil time.Time
	err        error
	warned     bool
	stopping   bool // Release has begun: no new heartbeat may start
	inFlight   bool // a heartbeat is on the wire

	release    sync.Once
	releaseErr error
}

func (c *Client) newLock(ac acquireConfig, s sent, token int64) (*Lock, error) {
	if !c.cfg.fencing {
		token = 0
	}
	hbCtx, stop := context.WithCancel(context.Background())
	l := &Lock{
		c: c, ac: ac, token: token, start: s.at, stopHB: stop, done: make(chan struct{}),
		lost: make(chan struct{}), expiring: make(chan struct{}),
		rvn: s, validUntil: s.at.Add(c.cfg.lease),
	}
	l.ctx, l.cancelCtx = context.WithCancelCause(context.Background())
	c.seen.forget(ac.key + "\x00" + ac.sortKey)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		stop()
		close(l.done)
		l.lose(ErrReleased)
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
		defer cancel()
		_ = c.writeRelease(ctx, ac, []string{s.rvn})
		return nil, ErrClosed
	}
	c.locks[l] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	go l.run(hbCtx)
	return l, nil
}

// Key returns the lock's partition key value.
func (l *Lock) Key() string { return l.ac.key }

// SortKey returns the lock's sort key value ("" if the table has none).
func (l *Lock) SortKey() string { return l.ac.sortKey }

// Token returns the lock's fencing token: larger than the token of every
// earlier acquisition of this key, constant for the lock's life (heartbeats
// do not change it). Pass it with every write to the protected resource,
// which must refuse a token lower than the highest it has seen. It is 0
// when the Client was made WithoutFencing.
func (l *Lock) Token() int64 { return l.token }

// Data returns the payload this acquisition stored (WithData), or nil.
// The caller must not modify it.
func (l *Lock) Data() []byte { return l.ac.data }

// Lost returns a channel closed when the lock ends: a heartbeat found
// another client's write on the item (taken over), no heartbeat was
// confirmed within one lease on this process's clock (expired), the
// maximum hold passed, or Release or Close was called. Err says which.
// It is closed before a release is written, so a holder watching it learns
// of the end before anyone else can acquire the lock.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Expiring returns a channel closed when less than the Client's expiry
// warning margin is left of the lock's local validity (its last confirmed
// heartbeat plus the lease) or of its maximum hold. It is checked against
// the remaining time, not at an instant, so it is closed even when the
// lock is found already expired (after a pause of the whole process), and
// always before Lost is closed for an expiry. It is not closed by a
// release or a takeover: watch Lost for those.
func (l *Lock) Expiring() <-chan struct{} { return l.expiring }

// Context returns a context cancelled when Lost is closed, with Err as its
// cause (context.Cause), for work that should stop when the lock ends.
func (l *Lock) Context() context.Context { return l.ctx }

// Err returns nil while the lock is held; then ErrReleased after Release
// or Close, or a *LostError wrapping ErrLockLost that says why it was lost.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// lose ends the lock with err (the first reason sticks).
func (l *Lock) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	var le *LostError
	if errors.As(err, &le) && le.Cause == Expired && !l.warned {
		l.warned = true
		close(l.expiring)
	}
	l.err = err
	close(l.lost)
	l.cancelCtx(err)
	if le != nil {
		l.c.log.Warn("dynamolock: lock lost", "lock", lockName(l.ac.key, l.ac.sortKey), "err", err)
	}
}

// Release ends the lock: it stops the heartbeats (cancelling one in
// flight, and waiting for the goroutine), closes Lost, and writes the
// release conditional on the item still carrying one of this lock's record
// version numbers, so it can neither release a newer holder's lock nor be
// undone by a late heartbeat. With fencing on the item stays, marked
// released, so the token never restarts. A release whose answer was lost is
// retried until ctx ends; each attempt waits at most a quarter of the lease
// for its answer, so one answer that never comes does not use up ctx.
//
// It returns nil if the lock was held until the release; the *LostError if
// it had been lost before (the release is still written after an expiry,
// if nobody took the lock over, to spare the next holder a lease of
// waiting); or the error that kept the release from being written (then
// the item is released by its lease expiring). Release is idempotent: later
// calls (and Close) return the first one's result.
func (l *Lock) Release(ctx context.Context) error {
	// Stop the heartbeats. Without one in flight, the RVNs are final at
	// once and the release need not wait for the goroutine to notice;
	// with one, its outcome must be known first.
	l.mu.Lock()
	l.stopping = true
	inFlight := l.inFlight
	l.mu.Unlock()
	l.stopped.Do(l.stopHB)
	if inFlight {
		<-l.done
	}
	l.lose(ErrReleased)
	l.releaseItem(ctx)
	<-l.done
	if err := l.Err(); !errors.Is(err, ErrReleased) {
		return err
	}
	return l.releaseErr
}

// releaseItem writes the release once, unless the lock was taken over
// (then there is nothing of ours to release). No heartbeat may be in
// flight.
func (l *Lock) releaseItem(ctx context.Context) {
	l.release.Do(func() {
		defer l.c.forget(l)
		l.mu.Lock()
		err := l.err
		rvns := l.rvnsLocked()
		l.mu.Unlock()
		var le *LostError
		if errors.As(err, &le) && le.Cause == TakenOver {
			return
		}
		l.releaseErr = l.c.writeRelease(ctx, l.ac, rvns)
	})
}

// Close is Release with a context bounded by the lease, for defer: a
// release whose answer is lost is retried (several times) within it.
func (l *Lock) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.c.cfg.lease)
	defer cancel()
	return l.Release(ctx)
}

// rvnsLocked returns every RVN of ours the item may carry.
func (l *Lock) rvnsLocked() []string {
	rvns := []string{l.rvn.rvn}
	for _, p := range l.pending {
		rvns = append(rvns, p.rvn)
	}
	return rvns
}

// run is the heartbeat goroutine: it writes a new RVN every heartbeat
// period, watches the local validity and the maximum hold, and ends the
// lock when one of them runs out or a heartbeat is refused. A heartbeat
// call runs in its own goroutine, so a slow one delays neither the warning
// nor the end of the lock, and is cut off after callTimeout, so one whose
// answer never comes is retried (conditional on its RVN too) well within
// the lease.
func (l *Lock) run(ctx context.Context) {
	defer l.c.wg.Done()
	defer close(l.done)
	c := l.c
	hb := c.cfg.heartbeat
	retry := backoff.Policy{Base: max(hb/8, time.Millisecond), Cap: max(hb/2, time.Millisecond)}
	next := l.start.Add(hb)
	var maxAt time.Time
	if l.ac.maxHold > 0 {
		maxAt = l.start.Add(l.ac.maxHold)
	}
	type result struct {
		s   sent
		err error
	}
	results := make(chan result, 1)
	var cancelCall context.CancelFunc // non-nil while a heartbeat is in flight
	var callAt time.Time              // when it was started
	// settle cancels the heartbeat in flight, if any, and waits for it, so
	// that the RVNs it may have written are known.
	settle := func() {
		if cancelCall != nil {
			cancelCall()
			<-results
			cancelCall = nil
			l.mu.Lock()
			l.inFlight = false
			l.mu.Unlock()
		}
	}
	defer settle()
	failures := 0
	var last error
	for {
		now := c.cfg.now()
		l.mu.Lock()
		valid := l.validUntil
		warned := l.warned
		l.mu.Unlock()

		if !maxAt.IsZero() && !now.Before(maxAt) {
			l.lose(&LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: MaxHold})
			settle()
			rctx, cancel := context.WithTimeout(context.Background(), c.cfg.lease)
			l.releaseItem(rctx)
			cancel()
			return
		}
		warnAt := valid.Add(-c.cfg.warning)
		if !maxAt.IsZero() && maxAt.Add(-c.cfg.warning).Before(warnAt) {
			warnAt = maxAt.Add(-c.cfg.warning)
		}
		if !warned && !now.Before(warnAt) {
			l.mu.Lock()
			if !l.warned {
				l.warned = true
				close(l.expiring)
			}
			l.mu.Unlock()
			warned = true
		}
		if !now.Before(valid) {
			if cancelCall != nil {
				// The heartbeat on the wire has had no answer: DynamoDB (or
				// the way to it) hangs. Say so, rather than nothing, which
				// would read like a paused process.
				hung := fmt.Errorf("dynamolock: a heartbeat sent %v before the lease ran out had no answer: %w",
					now.Sub(callAt).Round(time.Millisecond), context.DeadlineExceeded)
				if last != nil {
					hung = fmt.Errorf("%w (the heartbeat before it failed: %w)", hung, last)
				}
				last = hung
			}
			l.lose(&LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: Expired, Last: last})
			return
		}
		if cancelCall == nil && !now.Before(next) {
			l.mu.Lock()
			stopping := l.stopping
			l.inFlight = !stopping
			l.mu.Unlock()
			if stopping {
				return
			}
			var callCtx context.Context
			callCtx, cancelCall = context.WithCancel(ctx)
			callAt = now
			go func() {
				s, err := l.heartbeat(callCtx, valid)
				results <- result{s, err}
			}()
		}
		wake := valid
		if cancelCall == nil && next.Before(wake) {
			wake = next
		}
		if !maxAt.IsZero() && maxAt.Before(wake) {
			wake = maxAt
		}
		if !warned && warnAt.Before(wake) {
			wake = warnAt
		}
		t := time.NewTimer(wake.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case r := <-results:
			t.Stop()
			cancelCall()
			cancelCall = nil
			l.mu.Lock()
			l.inFlight = false
			l.mu.Unlock()
			var le *LostError
			switch {
			case errors.As(r.err, &le):
				l.lose(le)
				return
			case r.err != nil:
				failures++
				last = r.err
				next = c.cfg.now().Add(retry.Delay(failures + 2))
				c.log.Debug("dynamolock: heartbeat failed; retrying", "lock", lockName(l.ac.key, l.ac.sortKey), "err", r.err)
			default:
				failures = 0
				last = nil
				next = r.s.at.Add(hb)
			}
		}
	}
}

// heartbeat writes a new RVN conditional on one of ours. It returns the
// write when it is known to have applied; a *LostError when the item
// carries another client's RVN (or is released or gone); any other error
// when the outcome is unknown or the write was refused for another reason,
// in which case local validity is not extended.
func (l *Lock) heartbeat(ctx context.Context, valid time.Time) (sent, error) {
	c := l.c
	s := sent{rvn: newRVN(), at: c.cfg.now()}
	l.mu.Lock()
	cond := l.rvnsLocked()
	l.pending = append(l.pending, s)
	if len(l.pending) > maxPending {
		l.pending = l.pending[len(l.pending)-maxPending:]
	}
	l.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, min(valid.Sub(s.at), c.cfg.callTimeout()))
	defer cancel()
	values := map[string]types.AttributeValue{":new": str(s.rvn), ":lease": str(formatLease(c.cfg.lease))}
	_, err := c.api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(c.table), Key: c.itemKey(l.ac),
		UpdateExpression:                    aws.String("SET #rvn = :new, #lease = :lease"),
		ConditionExpression:                 aws.String(rvnIn(cond, values) + " AND attribute_not_exists(#rel)"),
		ExpressionAttributeNames:            map[string]string{"#rvn": AttrRVN, "#lease": AttrLease, "#rel": AttrReleased},
		ExpressionAttributeValues:           values,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}, once)
	if err == nil {
		l.confirm(s)
		return s, nil
	}
	item, ccf := conditionFailed(err)
	if !ccf && permanent(err) {
		l.mu.Lock()
		l.pending = drop(l.pending, s.rvn) // refused: it never applied
		l.mu.Unlock()
		return sent{}, err
	}
	if ctx.Err() != nil {
		return sent{}, err // stopped, or out of validity: nothing to gain from a read
	}
	if item == nil {
		it, rerr := c.get(ctx, l.ac)
		if rerr != nil {
			return sent{}, fmt.Errorf("%w; reading the item back: %w", err, rerr)
		}
		item = it
	}
	rec := parseItem(item)
	l.mu.Lock()
	cur := l.rvn
	p, isPending := find(l.pending, rec.rvn)
	l.mu.Unlock()
	switch {
	case rec.exists && !rec.released && isPending:
		l.confirm(p) // a write of ours applied after all
		return p, nil
	case rec.exists && !rec.released && rec.rvn == cur.rvn && !ccf:
		return sent{}, err // not applied (yet); it may still apply, so it stays pending
	}
	return sent{}, &LostError{Key: l.ac.key, SortKey: l.ac.sortKey, Cause: TakenOver, Owner: rec.owner}
}

// confirm records that write s applied: it becomes the lock's RVN, the
// writes sent before it can no longer apply (their conditions name older
// RVNs only), and local validity extends to s.at plus the lease.
func (l *Lock) confirm(s sent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s.at.After(l.rvn.at) || s.rvn == l.rvn.rvn {
		l.rvn = s
	}
	keep := l.pending[:0]
	for _, p := range l.pending {
		if p.at.After(s.at) {
			keep = append(keep, p)
		}
	}
	l.pending = keep
	if v := s.at.Add(l.c.cfg.lease); v.After(l.validUntil) {
		l.validUntil = v
	}
}

func drop(ss []sent, rvn string) []sent {
	out := ss[:0]
	for _, s := range ss {
		if s.rvn != rvn {
			out = append(out, s)
		}
	}
	return out
}
