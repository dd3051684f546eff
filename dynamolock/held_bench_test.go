package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

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
	reportLatency(b, "rtt", r.rtts)
	b.ReportMetric(float64(r.cut)/secs, "cut/s")
	b.ReportMetric(float64(r.fail)/secs, "failed/s")
	r.rtts, r.cut, r.fail = nil, 0, 0
}

// reportLatency reports the median and the 99th percentile of ds (which
// it sorts) in milliseconds, as name-p50-ms and name-p99-ms.
func reportLatency(b *testing.B, name string, ds []time.Duration) {
	slices.Sort(ds)
	q := func(f float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		return float64(ds[int(f*float64(len(ds)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.5), name+"-p50-ms")
	b.ReportMetric(q(0.99), name+"-p99-ms")
}

// BenchmarkHeldLocks reports, per count of locks one Client holds and
// heartbeat (the lease is four heartbeats), the heartbeat calls per
// second it sends (spread over the period: at most one per lock per
// heartbeat), their round trips, those cut off at their time bound or
// failed, the most on the wire at once, and the locks it lost. Each
// iteration holds the locks for one heartbeat period. Each case runs on a
// DynamoDB server of its own (1,000 locks at 500 ms would slow the shared
// one for every other test), through an HTTP client that keeps idle
// connections per host: 2 (Go's default transport), 10 (the SDK's default
// client, and the Client's most heartbeats in flight) or 64. Run it beside
// CPU hogs to see a slow server: a lock is lost only when no heartbeat of
// it is confirmed within a lease.
func BenchmarkHeldLocks(b *testing.B) {
	type params struct {
		n    int
		hb   time.Duration
		idle int
	}
	var cases []params
	for _, n := range []int{1, 100, 300, 1000} {
		for _, idle := range []int{2, 10, 64} {
			cases = append(cases, params{n, 500 * time.Millisecond, idle})
		}
	}
	cases = append(cases, params{1000, 5 * time.Second, 2}, params{1000, 5 * time.Second, 10}, params{1000, 5 * time.Second, 64})
	for _, tc := range cases {
		b.Run(fmt.Sprintf("locks=%d/heartbeat=%v/idle=%d", tc.n, tc.hb, tc.idle), func(b *testing.B) {
			n, hb := tc.n, tc.hb
			srv := testenv.DynamoDBServer(b)
			server := pooledClient(b, srv.Endpoint(), tc.idle)
			table := testenv.Table(b, server, false)
			api := newBeats(server)
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
			api.peakWire()
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
			b.ReportMetric(float64(api.peakWire()), "peak-on-wire")
			b.ReportMetric(float64(stacked), "stacked")
			b.ReportMetric(float64(lost), "lost")
		})
	}
}

// BenchmarkServerWrites measures what a DynamoDB server of the
// benchmark's own does with heartbeat-like writes and no lock client: w
// writers, each sending one conditional UpdateItem after another (a new
// RVN on an item of its own, conditional on the item's current RVN), for
// one second per iteration. It reports the writes per second the server
// confirmed and their round trips (p50, p99): beside the same load, the
// most heartbeats a second any client could have confirmed, and how long
// each would have waited.
func BenchmarkServerWrites(b *testing.B) {
	for _, tc := range []struct{ w, idle int }{{1, 2}, {8, 2}, {8, 8}, {64, 2}, {64, 64}} {
		b.Run(fmt.Sprintf("writers=%d/idle=%d", tc.w, tc.idle), func(b *testing.B) {
			w := tc.w
			srv := testenv.DynamoDBServer(b)
			api := pooledClient(b, srv.Endpoint(), tc.idle)
			table := testenv.Table(b, api, false)
			const items = 100 // each writer owns those whose index is its own modulo w
			for i := range items {
				if _, err := api.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table),
					Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: fmt.Sprint("w-", i)}, "rvn": &types.AttributeValueMemberS{Value: "0"}}}); err != nil {
					b.Fatal(err)
				}
			}
			var mu sync.Mutex
			var rtts []time.Duration
			failed := 0
			b.ResetTimer()
			start := time.Now()
			end := start.Add(time.Duration(b.N) * time.Second)
			var wg sync.WaitGroup
			for j := range w {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rvns := map[int]string{}
					for n, i := 1, j; time.Now().Before(end); n, i = n+1, nextOwn(i, j, w, items) {
						old, rvn := rvns[i], fmt.Sprint(j, "-", n)
						if old == "" {
							old = "0"
						}
						t0 := time.Now()
						_, err := api.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{
							TableName: aws.String(table), Key: docKey(fmt.Sprint("w-", i)),
							UpdateExpression:          aws.String("SET #rvn = :new"),
							ConditionExpression:       aws.String("#rvn = :old"),
							ExpressionAttributeNames:  map[string]string{"#rvn": "rvn"},
							ExpressionAttributeValues: map[string]types.AttributeValue{":new": &types.AttributeValueMemberS{Value: rvn}, ":old": &types.AttributeValueMemberS{Value: old}},
						})
						d := time.Since(t0)
						mu.Lock()
						if err != nil {
							failed++
						} else {
							rvns[i] = rvn
							rtts = append(rtts, d)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			secs := time.Since(start).Seconds()
			b.ReportMetric(float64(len(rtts))/secs, "writes/s")
			b.ReportMetric(float64(failed)/secs, "failed/s")
			reportLatency(b, "rtt", rtts)
		})
	}
}

// nextOwn returns the index after i of the items of writer j of w (those
// below items whose index is j modulo w), from j again after the last.
func nextOwn(i, j, w, items int) int {
	if i+w < items {
		return i + w
	}
	return j
}

// pooledClient returns a DynamoDB client of endpoint that keeps up to idle
// connections open between calls (Go's default transport keeps 2: a call
// beyond them opens a connection of its own and closes it after).
func pooledClient(t testing.TB, endpoint string, idle int) *dynamodb.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = idle
	t.Cleanup(tr.CloseIdleConnections)
	return services.DynamoDBClient(endpoint, &http.Client{Transport: services.OwnBody(tr)})
}
