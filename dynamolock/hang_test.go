package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// proxied returns a DynamoDB client whose connections go through a proxy
// that swallows answers: once dropNext is set, the next chunk any server
// answers is swallowed, with everything after it on that connection (the
// request applied, the answer never comes, the connection stays open);
// while blackhole is set, every answer is swallowed.
func proxied(t *testing.T, dropNext, blackhole *atomic.Bool) *dynamodb.Client {
	t.Helper()
	down := func(dst io.Writer, src io.Reader) {
		dead := false
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if !dead && dropNext.CompareAndSwap(true, false) {
					dead = true
				}
				if !dead && !blackhole.Load() {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						return
					}
				}
			}
			if err != nil {
				return
			}
		}
	}
	return clientFor(t, testenv.Proxy(t, testenv.DynamoDBEndpoint(t), nil, down))
}

// One heartbeat whose answer never comes (it applied; the reply was
// swallowed and the connection hangs) does not cost the holder its lock:
// the call is bounded well under the lease, and the retry, conditional on
// the hung write's RVN too, succeeds. A trial whose retry, sent on time,
// the server, too busy, left unanswered for the time the lock had left
// tested nothing, and is run again on a key of its own; any other loss,
// a missing retry or one sent late, fails the test.
func TestHungHeartbeatKeepsLock(t *testing.T) {
	t.Parallel()
	// A short heartbeat, and the largest allowed, half the lease. The hung
	// call waits three quarters of the time its lock has left, so the retry
	// has the last quarter (with half the lease as heartbeat, an eighth of
	// the lease); the lease is three test leases, so that a busy machine's
	// scheduling delays and a slowed server fit in it too.
	for _, c := range []struct{ lease, hb time.Duration }{{3 * testLease, 3 * testLease / 16}, {3 * testLease, 3 * testLease / 2}} {
		lease, hb := c.lease, c.hb
		t.Run(hb.String(), func(t *testing.T) {
			t.Parallel()
			server, table := newTable(t)
			var dropNext, blackhole, armed atomic.Bool
			var mu sync.Mutex
			var hungAt, retryAt time.Time // when the hung heartbeat and the one after it were sent
			api := &counting{DynamoDBAPI: proxied(t, &dropNext, &blackhole), before: func(op string) {
				if op != "heartbeat" {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case armed.CompareAndSwap(false, true):
					hungAt, retryAt = time.Now(), time.Time{}
					dropNext.Store(true) // this heartbeat's answer is the next one the server sends
				case retryAt.IsZero():
					retryAt = time.Now()
				}
			}}
			c := newClient(t, api, table, dynamolock.WithLease(lease), dynamolock.WithHeartbeat(hb))
			testenv.Conclusive(t, func(n int) error {
				key := fmt.Sprint("k", n)
				beats := len(api.recorded("heartbeat"))
				armed.Store(false) // the earlier trials' locks have ended: the next heartbeat is this lock's
				l := mustAcquire(t, c, key)
				before := attrS(readItem(t, server, table, key), dynamolock.RVNAttr)
				var lost error
				testenv.Until(t, "a heartbeat after the hung one confirmed", func() (bool, error) {
					if closed(l.Lost()) {
						lost = l.Err()
						return true, nil
					}
					return retried(api.recorded("heartbeat")[beats:]), nil
				})
				if dropNext.Load() {
					t.Fatal("no answer was swallowed: the test tested nothing")
				}
				mu.Lock()
				hung, retry := hungAt, retryAt
				mu.Unlock()
				// The hung call waits three quarters of the time its lock had
				// left, so the retry is due with a quarter of it left; one
				// sent with less than half that quarter was sent late.
				end := l.ValidUntil() // unchanged since: nothing after the hung one was confirmed
				switch {
				case lost == nil:
				case unanswered(lost) && !retry.IsZero() && end.Sub(retry) >= end.Sub(hung)/8:
					l.Close()
					return fmt.Errorf("the retry after the hung heartbeat, sent %v before the lease ran out, had no answer by then: %w", end.Sub(retry).Round(time.Millisecond), lost)
				case unanswered(lost) && !retry.IsZero():
					t.Fatalf("the retry after the hung heartbeat was sent %v before the lease ran out, of the %v it was due: %v",
						end.Sub(retry).Round(time.Millisecond), (end.Sub(hung) / 4).Round(time.Millisecond), lost)
				default:
					t.Fatalf("one hung heartbeat lost the lock: %v", lost)
				}
				if after := attrS(readItem(t, server, table, key), dynamolock.RVNAttr); after == before {
					t.Fatalf("record version unchanged (%s): heartbeats stalled", after)
				}
				if err := l.Close(); err != nil {
					t.Fatalf("close: %v", err)
				}
				return nil
			})
		})
	}
}

// retried reports whether a heartbeat among beats failed and one sent
// after it was confirmed.
func retried(beats []write) bool {
	for i, w := range beats {
		if w.err != nil {
			for _, later := range beats[i+1:] {
				if later.err == nil && later.sent.After(w.sent) {
					return true
				}
			}
		}
	}
	return false
}

// A release whose answer never comes is retried within Close's budget: the
// hung attempt is cut at three quarters of it, and the one retry,
// conditional on the release's own RVN, succeeds, so Close returns nil and
// the item ends released. A trial whose retry the server, too busy, left
// unanswered for the quarter it had tested nothing, and is run again on a
// key of its own; Close must then have said so (a deadline).
func TestHungReleaseRetried(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	var dropNext, blackhole, armed atomic.Bool
	api := &counting{DynamoDBAPI: proxied(t, &dropNext, &blackhole), before: func(op string) {
		if op == "release" && armed.CompareAndSwap(false, true) {
			dropNext.Store(true) // Release has stopped the heartbeats: the next answer is this one's
		}
	}}
	c := newClient(t, api, table, dynamolock.WithLease(2*testLease), dynamolock.WithHeartbeat(testLease)) // the retry has half a test lease
	testenv.Conclusive(t, func(n int) error {
		key := fmt.Sprint("k", n)
		armed.Store(false)
		l := mustAcquire(t, c, key)
		releases := len(api.recorded("release"))
		start := time.Now()
		err := l.Close()
		took := time.Since(start)
		if dropNext.Load() || !armed.Load() {
			t.Fatal("no answer was swallowed: the test tested nothing")
		}
		if item := readItem(t, server, table, key); attrS(item, dynamolock.ReleasedAttr) != "1" {
			t.Fatalf("item after Close: %v; want it released", item)
		}
		tries := api.recorded("release")[releases:]
		if len(tries) != 2 {
			t.Fatalf("%d release attempts; want the hung one and one retry (with the quarter of the lease it left)", len(tries))
		}
		if retry := tries[1].err; errors.Is(retry, context.DeadlineExceeded) {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the retry had no answer in time (%v), but Close returned %v", retry, err)
			}
			return fmt.Errorf("the retry, sent %v into Close, had no answer by its end", tries[1].sent.Sub(start).Round(time.Millisecond))
		}
		if err != nil {
			t.Fatalf("Close returned %v after %v, but the item was released", err, took)
		}
		t.Logf("Close took %v", took.Round(time.Millisecond))
		return nil
	})
}

// When DynamoDB hangs (no answer at all, rather than an error), the lock
// expires with a Last error that says so, so "unreachable" is told apart
// from "process paused".
func TestHungDynamoDBExpiresWithLast(t *testing.T) {
	t.Parallel()
	_, table := newTable(t)
	var dropNext, blackhole atomic.Bool
	api := proxied(t, &dropNext, &blackhole)
	c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/16))
	l := mustAcquire(t, c, "k")
	blackhole.Store(true)
	if !waitClosed(l.Lost(), 3*testLease) {
		t.Fatal("never lost while DynamoDB hung")
	}
	var lost *dynamolock.LostError
	if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.Expired {
		t.Fatalf("err %v; want a *LostError with Cause Expired", l.Err())
	}
	if lost.Last == nil {
		t.Fatalf("err %v: Last is nil; want the hung call's error", l.Err())
	}
	t.Logf("lost: %v", l.Err())
	blackhole.Store(false)
}

// A server that answers every call half a lease late is slow, not gone:
// Close waits for its release's answer instead of cutting it off and
// stacking retries on it, and returns nil after one attempt.
func TestSlowReleaseWaitedFor(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	slow := clientFor(t, testenv.Proxy(t, testenv.DynamoDBEndpoint(t), nil, testenv.Delay(testLease/2)))
	api := &counting{DynamoDBAPI: slow}
	c := newClient(t, api, table, dynamolock.WithLease(2*testLease)) // a test lease of slack beside the delay
	l := mustAcquire(t, c, "k")
	if err := l.Close(); err != nil {
		t.Fatalf("Close with answers half a lease late: %v", err)
	}
	if n := len(api.recorded("release")); n != 1 {
		t.Fatalf("%d release attempts; want 1: the first answer came within the time Close had", n)
	}
	if item := readItem(t, server, table, "k"); attrS(item, dynamolock.ReleasedAttr) != "1" {
		t.Fatalf("item after Close: %v; want it released", item)
	}
}
