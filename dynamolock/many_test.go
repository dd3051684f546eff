package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
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
	b.sent[key] = append(b.sent[key], time.Now())
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.onWire[key]--
		b.mu.Unlock()
	}()
	return b.DynamoDBAPI.UpdateItem(ctx, in, o...)
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
			locks[i], errs[i] = c.TryAcquire(context.Background(), fmt.Sprintf("%s-%d", prefix, i))
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

// renewStats is an observer that tallies a Client's heartbeats: the round
// trips of those confirmed, and those that failed, cut off at their time
// bound or not.
type renewStats struct {
	mu        sync.Mutex
	rtts      []time.Duration
	cut, fail int
}

func (r *renewStats) observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case e.Name == dynamolock.EventRenewed:
		r.rtts = append(r.rtts, e.Duration)
	case e.Name == dynamolock.EventRenewFailed && errors.Is(e.Err, context.DeadlineExceeded):
		r.cut++
	case e.Name == dynamolock.EventRenewFailed:
		r.fail++
	}
}

// report reports the heartbeats' round trips (median, 99th percentile)
// and the failures per second over secs, then starts a new tally.
func (r *renewStats) report(b *testing.B, secs float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slices.Sort(r.rtts)
	q := func(f float64) float64 {
		if len(r.rtts) == 0 {
			return 0
		}
		return float64(r.rtts[int(f*float64(len(r.rtts)-1))].Milliseconds())
	}
	b.ReportMetric(q(0.5), "rtt-p50-ms")
	b.ReportMetric(q(0.99), "rtt-p99-ms")
	b.ReportMetric(float64(r.cut)/secs, "cut/s")
	b.ReportMetric(float64(r.fail)/secs, "failed/s")
	r.rtts, r.cut, r.fail = nil, 0, 0
}

// BenchmarkHeldLocks reports, per count of locks one Client holds, the
// heartbeat calls per second it sends (lease 2 s, heartbeat 500 ms: two
// per lock per second, spread over the period), their round trips, those
// cut off at their time bound or failed, and the locks it lost. Each
// iteration holds the locks for one heartbeat period. Run it beside CPU
// hogs to see a slow server: a lock is lost only when no heartbeat of it
// is confirmed within a lease.
func BenchmarkHeldLocks(b *testing.B) {
	for _, n := range []int{1, 100, 300, 1000} {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			server, table := newTable(b)
			api := newBeats(server)
			hb := 500 * time.Millisecond
			var stats renewStats
			c := newClient(b, api, table, dynamolock.WithLease(4*hb), dynamolock.WithHeartbeat(hb), dynamolock.WithObserver(observe.Func(stats.observe)))
			locks, _ := holdAll(b, c, 4*hb, "bench", n)
			total := func() int {
				s := 0
				for _, l := range locks {
					sent, _ := api.count(l.Key())
					s += len(sent)
				}
				return s
			}
			from, start := total(), time.Now()
			stats.report(b, 1) // the acquisitions' part: discarded
			b.ResetTimer()
			for range b.N {
				time.Sleep(hb)
			}
			b.StopTimer()
			secs := time.Since(start).Seconds()
			lost := 0
			for _, l := range locks {
				if err := l.Err(); err != nil {
					if lost == 0 {
						b.Logf("first lost: %v", err)
					}
					lost++
				}
			}
			_, stacked := api.count("")
			b.ReportMetric(float64(n), "locks")
			b.ReportMetric(float64(total()-from)/secs, "heartbeats/s")
			stats.report(b, secs)
			b.ReportMetric(float64(stacked), "stacked")
			b.ReportMetric(float64(lost), "lost")
		})
	}
}
