package dynamolock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
)

// Writes whose answers are lost: each is resolved by reading the item back,
// and a write that applied is adopted. In particular a heartbeat that timed
// out but succeeded never costs the holder its lock (cirello-io/dynamolock
// #280), and a held lock's record version number keeps changing.
func TestLostResponses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server, table := newTable(t)
	for _, tc := range []struct {
		name string
		rule func(string) fault
	}{
		{"acquire answer lost", times("acquire", 1, dropResponse)},
		{"acquire retried by the SDK after it applied", times("acquire", 1, sdkRetry)},
		{"acquire request lost", times("acquire", 2, dropRequest)},
		{"heartbeat answers lost", times("heartbeat", 3, dropResponse)},
		{"heartbeats retried by the SDK after they applied", times("heartbeat", 3, sdkRetry)},
		{"heartbeat requests lost", times("heartbeat", 2, dropRequest)},
		{"release answer lost", times("release", 1, dropResponse)},
		{"release retried by the SDK after it applied", times("release", 1, sdkRetry)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			api := &faulty{DynamoDBAPI: server}
			api.setRule(tc.rule)
			c := newClient(t, api, table, dynamolock.WithHeartbeat(50*time.Millisecond))
			key := tc.name
			l := mustAcquire(t, c, key)
			if l.Token() != 1 {
				t.Fatalf("token %d, want 1", l.Token())
			}
			rvns := map[string]bool{}
			for i := 0; i < 8; i++ { // 3 leases' worth of heartbeats
				time.Sleep(testLease / 4)
				rvns[attrS(readItem(t, server, table, key), dynamolock.AttrRVN)] = true
			}
			if closed(l.Lost()) {
				t.Fatalf("the holder lost its lock: %v", l.Err())
			}
			if len(rvns) < 4 {
				t.Fatalf("only %d distinct record versions over 8 reads: heartbeats stalled", len(rvns))
			}
			if err := l.Release(ctx); err != nil {
				t.Fatalf("release: %v", err)
			}
			item := readItem(t, server, table, key)
			if attrS(item, dynamolock.AttrReleased) != "1" || attrN(item, dynamolock.AttrToken) != "1" {
				t.Fatalf("item after release: %v", item)
			}
		})
	}
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
	c := newClient(t, api, table, dynamolock.WithHeartbeat(50*time.Millisecond))
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
	if item := readItem(t, server, table, "k"); attrS(item, dynamolock.AttrReleased) != "1" {
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
// the last confirmed heartbeat.
func TestUnreachableExpires(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	api := &faulty{DynamoDBAPI: server}
	c := newClient(t, api, table, dynamolock.WithHeartbeat(50*time.Millisecond), dynamolock.WithExpiryWarning(150*time.Millisecond))
	l := mustAcquire(t, c, "k")
	time.Sleep(120 * time.Millisecond)
	cut := time.Now()
	api.blackhole.Store(true)
	warnedFirst := make(chan bool, 1)
	go func() { <-l.Lost(); warnedFirst <- closed(l.Expiring()) }()
	if !waitClosed(l.Expiring(), 2*time.Second) {
		t.Fatal("no warning")
	}
	warned := time.Since(cut)
	if !waitClosed(l.Lost(), 2*time.Second) {
		t.Fatal("never lost")
	}
	lostAfter := time.Since(cut)
	if !<-warnedFirst {
		t.Fatal("Lost closed before Expiring")
	}
	var lost *dynamolock.LostError
	if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.Expired || !errors.Is(l.Err(), errInjected) || !errors.Is(l.Err(), dynamolock.ErrLockLost) {
		t.Fatalf("err %v; want Expired, ErrLockLost and the injected error", l.Err())
	}
	// The last confirmed heartbeat was sent about one heartbeat (plus a
	// round trip) before the cut; the warning comes 150ms before the end.
	if lostAfter > testLease+400*time.Millisecond || lostAfter < testLease-250*time.Millisecond || warned < testLease-450*time.Millisecond {
		t.Fatalf("warned %v and lost %v after the cut; want lost about a lease (%v) after it, warned 150ms before", warned, lostAfter, testLease)
	}
	t.Logf("cut off: warned after %v, lost after %v", warned.Round(time.Millisecond), lostAfter.Round(time.Millisecond))
	api.blackhole.Store(false)
}

// A process paused past its lease wakes to find its lock expired: Expiring
// and Lost close at once, in that order, even though the warning's instant
// passed while it was paused (cirello-io/dynamolock #446), and no heartbeat
// is sent to revive the lock. The pause is simulated by the holder's clock
// jumping forward.
func TestExpiredOnWakeUp(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	api := &counting{DynamoDBAPI: server}
	var offset atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	c := newClient(t, api, table, dynamolock.WithClock(clock), dynamolock.WithHeartbeat(50*time.Millisecond))
	l := mustAcquire(t, c, "k")
	warnedFirst := make(chan bool, 1)
	go func() { <-l.Lost(); warnedFirst <- closed(l.Expiring()) }()
	time.Sleep(20 * time.Millisecond)
	offset.Store(int64(10 * testLease))
	if !waitClosed(l.Lost(), time.Second) {
		t.Fatal("not lost after the jump")
	}
	var lost *dynamolock.LostError
	if !errors.As(l.Err(), &lost) || lost.Cause != dynamolock.Expired {
		t.Fatalf("err %v; want Expired", l.Err())
	}
	if !<-warnedFirst {
		t.Fatal("Lost was closed before Expiring")
	}
	// Nothing is written once the lock is lost: the item keeps its version.
	before, rvn := api.updates.Load(), attrS(readItem(t, server, table, "k"), dynamolock.AttrRVN)
	time.Sleep(200 * time.Millisecond) // four heartbeat periods
	if n := api.updates.Load() - before; n != 0 || attrS(readItem(t, server, table, "k"), dynamolock.AttrRVN) != rvn {
		t.Fatalf("%d writes after the lock expired; the item must be left alone", n)
	}
}
