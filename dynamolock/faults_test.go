package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Writes whose answers are lost: each is resolved by reading the item back,
// and a write that applied is adopted. In particular a heartbeat that timed
// out but succeeded never costs the holder its lock (cirello-io/dynamolock
// #280), and after the faults the record version keeps changing. A lock
// that expired with a heartbeat unanswered within the lease (a server too
// busy) makes the trial inconclusive (testenv.Conclusive): another runs
// on a key and a fault rule of its own; so does an acquisition that took
// over a lease.
func TestLostResponses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	for _, tc := range []struct {
		name string
		op   string
		n    int
		what fault
	}{
		{"acquire answer lost", "acquire", 1, dropResponse},
		{"acquire retried by the SDK after it applied", "acquire", 1, sdkRetry},
		{"acquire request lost", "acquire", 2, dropRequest},
		{"heartbeat answers lost", "heartbeat", 3, dropResponse},
		{"heartbeats retried by the SDK after they applied", "heartbeat", 3, sdkRetry},
		{"heartbeat requests lost", "heartbeat", 2, dropRequest},
		{"release answer lost", "release", 1, dropResponse},
		{"release retried by the SDK after it applied", "release", 1, sdkRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testenv.Conclusive(t, func(trial int) error {
				api := &faulty{DynamoDBAPI: server}
				api.setRule(times(tc.op, tc.n, tc.what))
				events := &testenv.Events{}
				c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/16), dynamolock.WithObserver(observe.Func(events.Observe)))
				key := fmt.Sprint(tc.name, " ", trial)
				start := time.Now()
				l := mustAcquire(t, c, key)
				if l.Token() != 1 {
					// A write of ours found applied a lease after it was
					// sent is renewed by a fresh write, which takes the
					// next token: only a server too busy to answer
					// within the lease gets there. Our own write taken
					// for someone else's would be contended first.
					contended := len(events.Of(key, dynamolock.EventContended)) + len(events.Of(key, dynamolock.EventTakeover))
					if took := time.Since(start); took >= testLease && contended == 0 {
						l.Close()
						return fmt.Errorf("acquiring %q took %v, over a lease: token %d", key, took, l.Token())
					}
					t.Fatalf("token %d, want 1", l.Token())
				}
				rvn, changes := "", -1
				testenv.Until(t, "the faults injected and three heartbeats landed after them (or an unanswered heartbeat's expiry)", func() (bool, error) {
					if closed(l.Lost()) {
						if err := l.Err(); !unanswered(err) {
							return false, fmt.Errorf("the holder lost its lock: %w", err)
						}
						return true, nil
					}
					if tc.op != "release" && api.injected.Load() < int64(tc.n) {
						return false, nil
					}
					if r := attrS(readItem(t, server, table, key), dynamolock.RVNAttr); r != rvn {
						rvn, changes = r, changes+1
					}
					return changes >= 3, nil
				})
				if err := l.Err(); err != nil {
					l.Close()
					return fmt.Errorf("lock %q lost after %d injected faults: %w", key, api.injected.Load(), err)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatalf("release: %v", err)
				}
				if n := api.injected.Load(); n != int64(tc.n) {
					t.Fatalf("%d faults injected; want %d", n, tc.n)
				}
				item := readItem(t, server, table, key)
				if attrS(item, dynamolock.ReleasedAttr) != "1" || attrN(item, dynamolock.TokenAttr) != "1" {
					t.Fatalf("item after release: %v", item)
				}
				return nil
			})
		})
	}
}

// A throttled write changed nothing, and is treated so: a throttled
// heartbeat is retried without reading the item back, a TryAcquire whose
// writes were all throttled leaves no release to do in the background,
// and a throttled release returns the throttle at once, the item still
// held.
func TestThrottledWritesChangedNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	// A lock that expires before the checks, a heartbeat unanswered within
	// the lease (a server too busy), makes the trial inconclusive
	// (testenv.Conclusive): another runs on a key, a fault rule and
	// counters of its own.
	t.Run("heartbeats", func(t *testing.T) {
		t.Parallel()
		testenv.Conclusive(t, func(trial int) error {
			f := &faulty{DynamoDBAPI: server}
			f.setRule(times("heartbeat", 2, throttle))
			api := &counting{DynamoDBAPI: f}
			c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/16))
			key := "heartbeats" + strconv.Itoa(trial)
			l := mustAcquire(t, c, key)
			testenv.Until(t, "both throttles injected and a heartbeat landed after them (or an unanswered heartbeat's expiry)", func() (bool, error) {
				if closed(l.Lost()) {
					if err := l.Err(); !unanswered(err) {
						return false, fmt.Errorf("the holder lost its lock: %w", err)
					}
					return true, nil
				}
				return f.injected.Load() == 2 && api.succeeded("heartbeat") >= 1, nil
			})
			if err := l.Err(); unanswered(err) {
				l.Close()
				return fmt.Errorf("lock %q lost after %d injected throttles and %d heartbeats answered: %w", key, f.injected.Load(), api.succeeded("heartbeat"), err)
			} else if err != nil {
				t.Fatalf("the holder lost its lock: %v", err)
			}
			if n := api.gets.Load(); n != 0 {
				t.Fatalf("%d reads; a throttled heartbeat needs none", n)
			}
			// Checked, the lock may still expire the same way before the
			// release.
			if err := l.Release(ctx); err != nil && !unanswered(err) {
				t.Fatal(err)
			}
			return nil
		})
	})
	t.Run("TryAcquire", func(t *testing.T) {
		t.Parallel()
		f := &faulty{DynamoDBAPI: server}
		f.setRule(times("acquire", 1000, throttle))
		api := &counting{DynamoDBAPI: f}
		c := newClient(t, api, table)
		if l, err := c.TryAcquire(ctx, "try"); err == nil {
			l.Close()
			t.Fatal("acquired with every acquiring write throttled")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if n := len(api.recorded("release")); n != 0 {
			t.Fatalf("%d release writes after a TryAcquire whose writes were all throttled; want none", n)
		}
	})
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		f := &faulty{DynamoDBAPI: server}
		f.setRule(times("release", 1, throttle))
		c := newClient(t, f, table)
		l := mustAcquire(t, c, "release")
		if err := l.Release(ctx); !errors.Is(err, errThrottled) {
			t.Fatalf("release: %v; want the throttle", err)
		}
		if item := readItem(t, server, table, "release"); attrS(item, dynamolock.ReleasedAttr) != "" || attrS(item, dynamolock.OwnerAttr) != c.Owner() {
			t.Fatalf("item after a throttled release: %v; want still held", item)
		}
	})
}

// blocking holds heartbeats in flight, to race them with Release, and can
// deliver a held request late, as a slow network would.
type blocking struct {
	dynamolock.DynamoDBAPI
	block    atomic.Bool
	inFlight chan *dynamodb.UpdateItemInput
}

func (b *blocking) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if op(in) == "heartbeat" && b.block.Load() {
		b.inFlight <- in
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.DynamoDBAPI.UpdateItem(ctx, in, o...)
}

// A heartbeat in flight when Release is called cannot revive the lock
// (Java lock client PR #116): Release cancels it and waits for the
// heartbeat goroutine; when the stale heartbeat reaches DynamoDB after the
// release, its condition fails, and the next holder gets the lock at once.
func TestHeartbeatRacingRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	api := &blocking{DynamoDBAPI: server, inFlight: make(chan *dynamodb.UpdateItemInput, 1)}
	c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/16))
	l := mustAcquire(t, c, "k")
	api.block.Store(true)
	late := <-api.inFlight // a heartbeat is on the wire
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release with a heartbeat in flight: %v", err)
	}
	_, err := server.UpdateItem(ctx, late)
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		t.Fatalf("the late heartbeat after the release: %v; want a failed condition", err)
	}
	if item := readItem(t, server, table, "k"); attrS(item, dynamolock.ReleasedAttr) != "1" {
		t.Fatalf("item after the late heartbeat: %v; want it released", item)
	}
	other := newClient(t, server, table)
	start := time.Now()
	l2, err := other.TryAcquire(ctx, "k")
	if err != nil || l2.Token() != 2 {
		t.Fatalf("next holder: %v", err)
	}
	t.Logf("next holder got the lock in %v", time.Since(start).Round(time.Millisecond))
	l2.Close()
}

// DynamoDB unreachable: the lock is not extended on errors. Expiring closes
// first, then Lost with Cause Expired and the last DynamoDB error in its
// chain (so "lost" and "unreachable" can be told apart), one lease after
// the last confirmed write was sent. The test knows that send time within
// bounds: no later than the wrapper saw the write, and no earlier than
// the answer to the write before it (one write is on the wire at a time).
func TestUnreachableExpires(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	cut := &faulty{DynamoDBAPI: server}
	api := &counting{DynamoDBAPI: cut}
	warning := testLease / 4
	c := newClient(t, api, table, dynamolock.WithHeartbeat(testLease/8), dynamolock.WithExpiryWarning(warning))
	l := mustAcquire(t, c, "k")
	testenv.Until(t, "two heartbeats confirmed", func() (bool, error) { return api.succeeded("heartbeat") >= 2, nil })
	cut.blackhole.Store(true)
	t.Cleanup(func() { cut.blackhole.Store(false) }) // before c's Close
	warnedFirst := make(chan bool, 1)
	go func() { <-l.Lost(); warnedFirst <- closed(l.Expiring()) }()
	if !waitClosed(l.Expiring(), 2*testLease) {
		t.Fatal("no warning")
	}
	warned := time.Now()
	if !waitClosed(l.Lost(), 2*testLease) {
		t.Fatal("never lost")
	}
	lostAt := time.Now()
	if !<-warnedFirst {
		t.Fatal("Lost closed before Expiring")
	}
	var lost *dynamolock.LostError
	if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.Expired || !errors.Is(l.Err(), errInjected) || !errors.Is(l.Err(), dynamolock.ErrLockLost) {
		t.Fatalf("err %v; want Expired, ErrLockLost and the injected error", l.Err())
	}
	writes := api.recorded("")
	k := len(writes) - 1
	for writes[k].err != nil {
		k--
	}
	earliest, latest := writes[k-1].done, writes[k].sent // the last confirmed write's send
	slack := testLease / 4                               // a timer's and a goroutine's delay on a busy machine
	if lostAt.Before(earliest.Add(testLease)) || lostAt.After(latest.Add(testLease+slack)) ||
		warned.Before(earliest.Add(testLease-warning)) || warned.After(latest.Add(testLease-warning+slack)) {
		t.Fatalf("warned %v and lost %v after the last confirmed write (sent %v after the answer before it); want lost a lease (%v) after it, warned %v before that",
			warned.Sub(latest), lostAt.Sub(latest), latest.Sub(earliest), testLease, warning)
	}
	t.Logf("cut off: warned %v and lost %v after the last confirmed write", warned.Sub(latest).Round(time.Millisecond), lostAt.Sub(latest).Round(time.Millisecond))
}

// A process paused past its lease wakes to find its lock expired: Expiring
// and Lost close at once, in that order, even though the warning's instant
// passed while it was paused (cirello-io/dynamolock #446), and no heartbeat
// is sent to revive the lock. The same holds when the maximum hold has
// passed too (then it is the cause). The pause is simulated by the
// holder's clock jumping ten leases forward as the first heartbeat's
// answer arrives, so the lock's goroutine next runs after the jump.
func TestExpiredOnWakeUp(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	for _, tc := range []struct {
		name  string
		opts  []dynamolock.AcquireOption
		cause dynamolock.Cause
	}{
		{"lease", nil, dynamolock.Expired},
		{"maximum hold", []dynamolock.AcquireOption{dynamolock.WithMaxHold(2 * testLease)}, dynamolock.MaxHold},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var offset atomic.Int64
			clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
			api := &counting{DynamoDBAPI: server, after: func(op string, err error) {
				if op == "heartbeat" && err == nil {
					offset.CompareAndSwap(0, int64(10*testLease))
				}
			}}
			c := newClient(t, api, table, dynamolock.WithClock(clock), dynamolock.WithHeartbeat(testLease/8))
			l := mustAcquire(t, c, tc.name, tc.opts...)
			warnedFirst := make(chan bool, 1)
			go func() { <-l.Lost(); warnedFirst <- closed(l.Expiring()) }()
			if !waitClosed(l.Lost(), 2*testLease) {
				t.Fatal("not lost after the jump")
			}
			var lost *dynamolock.LostError
			if !errors.As(l.Err(), &lost) || lost.Cause != tc.cause {
				t.Fatalf("err %v; want %v", l.Err(), tc.cause)
			}
			if !<-warnedFirst {
				t.Fatal("Lost was closed before Expiring")
			}
			// Close waits for the lock's goroutine: nothing more can be sent.
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if n := len(api.recorded("heartbeat")); n != 1 {
				t.Fatalf("%d heartbeats sent; want the one whose answer came after the jump, and none to revive the lock", n)
			}
		})
	}
}

// A process paused (or a store slow) past the lease as the acquiring
// write's answer arrives gets its lock all the same: before Acquire
// returns, one heartbeat, conditional on the acquiring write's RVN,
// proves that no one took the item meanwhile and starts the lock's
// validity afresh. The token is the acquisition's. A lock whose maximum
// hold has passed by then is returned lost, with no heartbeat sent.
func TestAcquiredLateIsRenewedFirst(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	for _, maxHold := range []bool{false, true} {
		t.Run(fmt.Sprint("max hold ", maxHold), func(t *testing.T) {
			t.Parallel()
			testenv.Conclusive(t, func(n int) error {
				var offset atomic.Int64
				clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
				api := &counting{DynamoDBAPI: server, after: func(op string, err error) {
					if op == "acquire" && err == nil {
						offset.Store(int64(10 * testLease))
					}
				}}
				c := newClient(t, api, table, dynamolock.WithClock(clock), dynamolock.WithHeartbeat(testLease/8))
				var opts []dynamolock.AcquireOption
				if maxHold {
					opts = append(opts, dynamolock.WithMaxHold(2*testLease))
				}
				key := fmt.Sprint("late ", maxHold, n)
				l := mustAcquire(t, c, key, opts...)
				beats := len(api.recorded("heartbeat"))
				if maxHold {
					<-l.Lost()
					var lost *dynamolock.LostError
					if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.MaxHold || beats != 0 {
						t.Fatalf("err %v, %d heartbeats; want the maximum hold's loss and none", l.Err(), beats)
					}
					return nil
				}
				if err := l.Err(); unanswered(err) {
					return fmt.Errorf("the heartbeat before Acquire returned had no answer within the lease: %w", err)
				} else if err != nil || beats != 1 || l.Token() != 1 {
					t.Fatalf("after Acquire: err %v, %d heartbeats, token %d; want held, renewed once, token 1", err, beats, l.Token())
				}
				if err := l.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
				return nil
			})
		})
	}
}
