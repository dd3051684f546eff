package dynamolock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// beats wraps a DynamoDB client: it records when each lock's heartbeats
// were sent, and counts a heartbeat sent while another of the same lock
// was still on the wire (a stacked call).
type beats struct {
	dynamolock.DynamoDBAPI
	mu      sync.Mutex
	onWire  map[string]int
	sent    map[string][]time.Time
	stacked int
	wire    int // heartbeats on the wire now, of every lock
	peak    int // the most at once
}

func newBeats(api dynamolock.DynamoDBAPI) *beats {
	return &beats{DynamoDBAPI: api, onWire: map[string]int{}, sent: map[string][]time.Time{}}
}

func (b *beats) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if op(in) != "heartbeat" {
		return b.DynamoDBAPI.UpdateItem(ctx, in, o...)
	}
	key := attrS(in.Key, "pk")
	b.mu.Lock()
	b.onWire[key]++
	if b.onWire[key] > 1 {
		b.stacked++
	}
	b.wire++
	b.peak = max(b.peak, b.wire)
	b.sent[key] = append(b.sent[key], time.Now())
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.onWire[key]--
		b.wire--
		b.mu.Unlock()
	}()
	return b.DynamoDBAPI.UpdateItem(ctx, in, o...)
}

// peakWire returns the most heartbeats that were on the wire at once, and
// starts a new count.
func (b *beats) peakWire() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.peak
	b.peak = b.wire
	return p
}

// count returns the heartbeats sent for key, and the stacked calls.
func (b *beats) count(key string) (sent []time.Time, stacked int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]time.Time(nil), b.sent[key]...), b.stacked
}

// holdAll acquires n locks on c at once (ten goroutines, so as not to
// swamp the test server, which other tests share) and returns them with
// the instants their acquiring writes were sent.
func holdAll(t testing.TB, c *dynamolock.Client, lease time.Duration, prefix string, n int) ([]*dynamolock.Lock, []time.Time) {
	t.Helper()
	locks, at := make([]*dynamolock.Lock, n), make([]time.Time, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	slots := make(chan struct{}, 10)
	for i := range locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			slots <- struct{}{}
			defer func() { <-slots }()
			// Acquire, not TryAcquire: on a server slowed by load, a call
			// that took longer than a lease is tried again.
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(time.Minute))
			defer cancel()
			locks[i], errs[i] = c.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i))
			if errs[i] == nil {
				at[i] = locks[i].ValidUntil().Add(-lease) // before its first heartbeat, half a period away
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("lock %d: %v", i, err)
		}
	}
	return locks, at
}

// One Client holding many locks acquired at once heartbeats them at
// spread-out moments (each lock's first heartbeat comes between half a
// period and a period after its acquisition, at random, so the offsets
// span about half a period, where heartbeats due at one instant would all
// share one offset), never stacks a heartbeat on one of the same lock
// still on the wire, and loses none. Not parallel: the test server is
// busy enough with its heartbeats (50 locks, a heartbeat a lease-long
// test period: 80 calls a second without -race).
func TestManyLocksSpreadHeartbeats(t *testing.T) {
	const n = 50
	server, table := newTable(t)
	api := newBeats(server)
	hb := testLease
	c := newClient(t, api, table, dynamolock.WithLease(4*testLease), dynamolock.WithHeartbeat(hb))
	locks, at := holdAll(t, c, 4*testLease, "many", n)
	testenv.Until(t, "4 heartbeats of every lock", func() (bool, error) {
		for i, l := range locks {
			if err := l.Err(); err != nil {
				return false, fmt.Errorf("lock %d lost: %w", i, err)
			}
			if sent, _ := api.count(l.Key()); len(sent) < 4 {
				return false, nil
			}
		}
		return true, nil
	})
	var lo, hi time.Duration
	for i, l := range locks {
		sent, _ := api.count(l.Key())
		off := sent[0].Sub(at[i])
		if i == 0 || off < lo {
			lo = off
		}
		if i == 0 || off > hi {
			hi = off
		}
	}
	_, stacked := api.count("")
	lost := 0
	for _, l := range locks {
		if l.Err() != nil {
			lost++
		}
	}
	t.Logf("%d locks: first heartbeats %v to %v after their acquisitions (period %v); %d stacked calls; %d lost", n, lo, hi, hb, stacked, lost)
	if hi-lo < hb/4 || stacked != 0 || lost != 0 {
		t.Fatalf("first heartbeats' offsets span %v (want at least a quarter period, %v); %d stacked heartbeats, %d locks lost (want 0)", hi-lo, hb/4, stacked, lost)
	}
}
