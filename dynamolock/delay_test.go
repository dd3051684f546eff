package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// A network between one holder and DynamoDB that holds the holder's
// packets past its lease and then lets them through: the seed's 90-second
// packet delay, scaled down (a testenv.Gate in a proxy, shut, then opened
// once a waiter has taken the lock over and written through the fence).
// What the holder sent meanwhile reaches DynamoDB late: its heartbeats
// (sent while its lease still ran), a fenced write, and in every other
// trial its release. Each late write must be refused, by its condition or
// by the fence. The waiter keeps its lock (its own release says it held it
// until then), the fenced item keeps the waiter's write last, no two
// holders overlapped by their own clocks (the ledger), and the holder
// learns the truth: Lost with Cause Expired and the unanswered heartbeat
// as its last error, or a Release that reports it could not write the
// release. Under NOLOCK_STRESS=1, 1,000 trials. A round of trials in
// which no heartbeat was held (each holder's lock expired before the gate
// shut, a heartbeat unanswered within the lease on a busy machine) tested
// nothing: it is inconclusive, and another round runs
// (testenv.Conclusive).
func TestDelayedWritesRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.DynamoDBServer(t)
	direct := srv.Client()
	table := testenv.Table(t, direct, false)
	trials, workers := testenv.Trials(8, 1000), testenv.Trials(8, 20)
	rigs := make([]*delayRig, workers)
	for w := range rigs {
		gate := testenv.NewGate()
		late := &patient{DynamoDBAPI: clientFor(t, testenv.Proxy(t, srv.Endpoint(), gate.Relay(), nil))}
		rigs[w] = &delayRig{gate: gate, late: late, direct: direct, table: table,
			holder: newClient(t, late, table, dynamolock.WithHeartbeat(testLease/2)),
			waiter: newClient(t, direct, table, dynamolock.WithPoll(testLease/8))}
	}
	res := &delayCounts{ledger: newLedger(), late: map[string]int{}}
	testenv.Conclusive(t, func(round int) error {
		from := (round - 1) * trials
		testenv.RunTrials(t, trials, workers, func(w, i int) {
			if err := rigs[w].trial(from+i, res); err != nil {
				t.Errorf("trial %d: %v", from+i, err)
			}
		})
		res.mu.Lock()
		defer res.mu.Unlock()
		if res.heartbeating == 0 {
			return fmt.Errorf("no trial held a heartbeat (%d of the %d holders that were to hold one had lost their lock before the gate shut, a heartbeat unanswered within the lease)", res.expiredBeforeShut, res.quiet)
		}
		return nil
	})
	_, broken := res.ledger.counts()
	for _, b := range broken {
		t.Error(b)
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	sent := 0
	for _, n := range res.late {
		sent += n
	}
	testenv.Figures(t, "dynamolock delayed network", "%d trials, %d late writes (%d heartbeats, %d releases, %d fenced writes), %d accepted, %d undelivered (connection closed by the server), held %v to %v",
		res.trials, sent, res.late["heartbeat"], res.late["release"], res.late["fenced write"], res.accepted, res.undelivered,
		res.minHeld.Round(time.Millisecond), res.maxHeld.Round(time.Millisecond))
	t.Logf("%d trials held a heartbeat; %d without a release held none, %d of them as their holder's lock had expired before the gate shut; %d waiters' leases ran out before their release was answered (a busy machine)",
		res.heartbeating, res.quiet, res.expiredBeforeShut, res.waiterExpired)
	if res.accepted != 0 {
		t.Fatalf("%d late writes accepted; want none", res.accepted)
	}
}

// delayRig is one worker's fixtures: a holder whose every packet passes
// through gate, and a waiter with a direct connection.
type delayRig struct {
	gate           *testenv.Gate
	late           *patient
	direct         dynamolock.DynamoDBAPI
	holder, waiter *dynamolock.Client
	table          string
}

// delayCounts sums the trials' outcomes.
type delayCounts struct {
	ledger *ledger

	mu                    sync.Mutex
	trials, heartbeating  int            // trials, and those in which a heartbeat was held
	accepted, undelivered int            // late writes accepted, and those whose connection the server had closed
	waiterExpired         int            // waiters whose own lease ran out before their release
	quiet                 int            // trials without a release in which no heartbeat was held
	expiredBeforeShut     int            // of those, the holders whose lock expired, a heartbeat unanswered, before the gate shut
	late                  map[string]int // late writes sent, by kind
	minHeld, maxHeld      time.Duration
}

// trial runs one trial on its own key; it returns what went wrong.
func (r *delayRig) trial(i int, res *delayCounts) error {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
	defer cancel()
	key := fmt.Sprintf("t%d", i)
	doc := "doc/" + key
	release := i%2 == 1
	floor := res.ledger.floor(key)
	h, err := r.holder.Acquire(ctx, key)
	if err != nil {
		return fmt.Errorf("holder: %w", err)
	}
	res.ledger.acquired(key, h, floor)
	if err := fencedAppend(ctx, r.late, r.table, doc, h); err != nil {
		return fmt.Errorf("holder's fenced write before the delay: %w", err)
	}

	if !release {
		// Shut the gate just after a heartbeat was answered, so that the
		// next one, half a lease after that one was sent, is sent while it
		// is shut, even if the answer took most of that.
		after := time.Now()
		if err := testenv.Poll("a heartbeat answered", func() (bool, error) {
			for _, w := range r.late.recorded(key) {
				if w.op == "heartbeat" && w.err == nil && w.done.After(after) {
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
	}
	r.gate.Shut()
	shut := time.Now()
	before := h.Err()
	defer r.gate.Open()
	lateWrite := make(chan error, 1)
	go func() { lateWrite <- fencedAppend(ctx, r.late, r.table, doc, h) }() // waits for its answer
	closeErr := make(chan error, 1)
	if release {
		go func() {
			called := time.Now()
			err := h.Close()
			res.ledger.released(key, h, called, err)
			closeErr <- err
		}()
	}
	floor = res.ledger.floor(key)
	w, err := r.waiter.Acquire(ctx, key)
	if err != nil {
		return fmt.Errorf("waiter: %w", err)
	}
	res.ledger.acquired(key, w, floor) // the holder's validity has ended
	if err := fencedAppend(ctx, r.direct, r.table, doc, w); err != nil {
		return fmt.Errorf("waiter's fenced write: %w", err)
	}
	// Once the holder's goroutines have ended (Close returned, or Lost
	// closed when its validity, which ended before the waiter's takeover,
	// ran out), every write it sent is known: let them through.
	var closeErrV error
	if release {
		closeErrV = <-closeErr
	} else if !waitClosed(h.Lost(), testLease) {
		return errors.New("the holder never learned of its loss")
	}
	r.gate.Open()
	held := time.Since(shut)
	<-lateWrite // counted below, with the other late writes
	if err := r.late.settled(ctx); err != nil {
		return err
	}
	counts := map[string]int{}
	accepted, undelivered := 0, 0
	var unexpected error
	for _, lw := range r.late.recorded(key, doc) {
		if lw.sent.Before(shut) {
			continue
		}
		kind := lw.op
		if kind == "other" {
			kind = "fenced write"
		}
		counts[kind]++
		var ccf *types.ConditionalCheckFailedException
		var broke *smithyhttp.RequestSendError
		switch {
		case lw.err == nil:
			accepted++
		case errors.As(lw.err, &ccf):
		case errors.As(lw.err, &broke): // the server had closed the idle connection
			undelivered++
		default:
			unexpected = fmt.Errorf("late %s: %v; want a failed condition", kind, lw.err)
		}
	}
	res.add(held, accepted, undelivered, counts)
	if !release && counts["heartbeat"] == 0 {
		res.mu.Lock()
		res.quiet++
		if unanswered(before) {
			res.expiredBeforeShut++
		}
		res.mu.Unlock()
	}
	if accepted > 0 {
		return fmt.Errorf("%d late writes accepted: %v", accepted, counts)
	}
	if unexpected != nil {
		return unexpected
	}

	// The holder learns the truth: Close reports that it could not write
	// the release (or the expiry, if the lease ran out before Close was
	// called); Lost says Expired, with the unanswered heartbeat as the last
	// error if one was on its way.
	var lost *dynamolock.LostError
	expired := errors.As(h.Err(), &lost) && lost.Cause == dynamolock.Expired
	switch {
	case release && (closeErrV == nil || !expired && !errors.Is(h.Err(), dynamolock.ErrReleased)):
		return fmt.Errorf("holder's Close with its release held: %v (lock: %v); want an error", closeErrV, h.Err())
	case !release && (!expired || counts["heartbeat"] > 0 && !errors.Is(h.Err(), context.DeadlineExceeded)):
		return fmt.Errorf("holder's loss: %v; want Expired, with the unanswered heartbeat", h.Err())
	case !release:
		if err := h.Close(); !errors.Is(err, dynamolock.ErrLockLost) {
			return fmt.Errorf("holder's Close after its loss: %v; want the loss", err)
		}
	}

	called := time.Now()
	werr := w.Close()
	res.ledger.released(key, w, called, werr)
	// A late write that landed would have cost the waiter its lock (taken
	// over); on a machine too busy for its heartbeats it may have expired.
	// Or its release may not have been answered within the lease Close
	// allows it (then the lease runs out: the outcome is the same).
	if errors.As(werr, &lost) && lost.Cause == dynamolock.Expired || errors.Is(werr, context.DeadlineExceeded) {
		res.mu.Lock()
		res.waiterExpired++
		res.mu.Unlock()
	} else if werr != nil {
		return fmt.Errorf("waiter's release: %v; want nil (it held the lock until then)", werr)
	}
	out, err := r.direct.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(r.table), Key: docKey(doc), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return err
	}
	if toks := fencedTokens(out.Item); len(toks) == 0 || !slices.IsSorted(toks) || toks[len(toks)-1] != w.Token() {
		return fmt.Errorf("fenced writes accepted with tokens %v; want them in order, the waiter's (%d) last", toks, w.Token())
	}
	return nil
}

// add counts a trial whose late writes were all answered.
func (res *delayCounts) add(held time.Duration, accepted, undelivered int, late map[string]int) {
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.trials == 0 || held < res.minHeld {
		res.minHeld = held
	}
	res.maxHeld = max(res.maxHeld, held)
	res.trials++
	res.accepted += accepted
	res.undelivered += undelivered
	if late["heartbeat"] > 0 {
		res.heartbeating++
	}
	for k, n := range late {
		res.late[k] += n
	}
}

// patient keeps every UpdateItem waiting for its answer after its caller
// gives up (the caller gets its context's error at once), as a request in
// flight still reaches the server after its sender stopped listening, and
// records each one (see write) when its answer comes.
type patient struct {
	dynamolock.DynamoDBAPI
	wg     sync.WaitGroup
	mu     sync.Mutex
	writes []write
}

func (p *patient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	w := write{op: op(in), key: attrS(in.Key, "pk"), sent: time.Now()}
	type answer struct {
		out *dynamodb.UpdateItemOutput
		err error
	}
	answered := make(chan answer, 1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		out, err := p.DynamoDBAPI.UpdateItem(context.WithoutCancel(ctx), in, o...)
		w.done, w.err = time.Now(), err
		p.mu.Lock()
		p.writes = append(p.writes, w)
		p.mu.Unlock()
		answered <- answer{out, err}
	}()
	select {
	case a := <-answered:
		return a.out, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// settled waits until every write has had its answer. No new write may
// start meanwhile.
func (p *patient) settled(ctx context.Context) error {
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("late writes still unanswered: %w", ctx.Err())
	}
}

// recorded returns the answered writes to the items keys.
func (p *patient) recorded(keys ...string) []write {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []write
	for _, w := range p.writes {
		if slices.Contains(keys, w.key) {
			out = append(out, w)
		}
	}
	return out
}
