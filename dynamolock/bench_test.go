package dynamolock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/testenv"
)

// The anchor's settings (cirello.io/dynamolock v2.2.0, the client the
// benchmarks compare against): lease 2 s, heartbeat 500 ms, refresh (our
// poll) 50 ms.
const (
	benchLease     = 2 * time.Second
	benchHeartbeat = 500 * time.Millisecond
	benchPoll      = 50 * time.Millisecond
)

// BenchmarkLock measures, on the default DynamoDB test server, with the
// anchor's settings, and against raw conditional writes in the same run:
//
//	pair/raw          one conditional UpdateItem to take (item absent or released) and one
//	                  to release (RVN unchanged): the floor any lock client pays
//	pair/lock         Acquire + Release, one goroutine
//	pair/interleaved  a raw pair and a lock pair in turn, timed apart: the ratio
//	                  under the same machine load (this machine is shared and noisy)
//	contended/raw     8 goroutines, one key: the raw take, retried every poll when refused
//	contended/lock    8 Clients, one key: Acquire + Release
//	takeover          a waiter is polling when the holder is cut off (every call it makes
//	                  fails, like a crash): time from the cut to the waiter's acquisition
//
// It reports pairs/s (or acquisitions/s), p50 and p99 latency, DynamoDB
// calls per pair, overlaps (two holders inside at once: must be 0), and
// takeover time. Run: go test -run '^$' -bench . -benchtime 3s ./dynamolock
// (the takeover scenario takes about 2.5 s per iteration: give it
// -benchtime 10x on its own for a distribution).
func BenchmarkLock(b *testing.B) {
	server := testenv.DynamoDB(b)
	table := testenv.Table(b, server, false)
	var keyN atomic.Int64
	freshKey := func() string { return fmt.Sprint("bench-", keyN.Add(1)) }
	newBenchClient := func(b *testing.B, api dynamolock.DynamoDBAPI) *dynamolock.Client {
		c, err := dynamolock.New(api, table, dynamolock.WithKeyAttributes("pk", ""),
			dynamolock.WithLease(benchLease), dynamolock.WithHeartbeat(benchHeartbeat), dynamolock.WithPoll(benchPoll))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}

	b.Run("pair/raw", func(b *testing.B) {
		api := &counting{DynamoDBAPI: server}
		key := freshKey()
		measure(b, 1, "pairs", api, nil, func(ctx context.Context, _ int) error {
			ok, rvn, err := rawTake(ctx, api, table, key)
			if err == nil && !ok {
				err = errors.New("raw take refused without contention")
			}
			if err != nil {
				return err
			}
			return rawRelease(ctx, api, table, key, rvn)
		})
	})
	b.Run("pair/lock", func(b *testing.B) {
		api := &counting{DynamoDBAPI: server}
		c := newBenchClient(b, api)
		key := freshKey()
		measure(b, 1, "pairs", api, nil, func(ctx context.Context, _ int) error {
			l, err := c.Acquire(ctx, key)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		})
	})
	b.Run("pair/interleaved", func(b *testing.B) {
		// Raw and lock pairs alternate, so both see the same machine load.
		api := &counting{DynamoDBAPI: server}
		c := newBenchClient(b, api)
		rawKey, lockKey := freshKey(), freshKey()
		ctx := context.Background()
		var raw, lock time.Duration
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			ok, rvn, err := rawTake(ctx, api, table, rawKey)
			if err == nil && ok {
				err = rawRelease(ctx, api, table, rawKey, rvn)
			}
			t1 := time.Now()
			if err == nil {
				var l *dynamolock.Lock
				if l, err = c.Acquire(ctx, lockKey); err == nil {
					err = l.Release(ctx)
				}
			}
			if err != nil {
				b.Fatal(err)
			}
			raw += t1.Sub(t0)
			lock += time.Since(t1)
		}
		b.ReportMetric(float64(b.N)/raw.Seconds(), "raw-pairs/s")
		b.ReportMetric(float64(b.N)/lock.Seconds(), "lock-pairs/s")
		b.ReportMetric(raw.Seconds()/lock.Seconds(), "x-raw")
	})
	b.Run("contended/raw", func(b *testing.B) {
		api := &counting{DynamoDBAPI: server}
		key := freshKey()
		var inside, overlaps atomic.Int64
		measure(b, 8, "acquisitions", api, &overlaps, func(ctx context.Context, _ int) error {
			for {
				ok, rvn, err := rawTake(ctx, api, table, key)
				if err != nil {
					return err
				}
				if ok {
					if inside.Add(1) > 1 {
						overlaps.Add(1)
					}
					inside.Add(-1)
					return rawRelease(ctx, api, table, key, rvn)
				}
				time.Sleep(benchPoll/2 + time.Duration(keyN.Load()%int64(benchPoll/2)))
			}
		})
	})
	b.Run("contended/lock", func(b *testing.B) {
		api := &counting{DynamoDBAPI: server}
		cs := make([]*dynamolock.Client, 8)
		for i := range cs {
			cs[i] = newBenchClient(b, api)
		}
		key := freshKey()
		var inside, overlaps atomic.Int64
		measure(b, 8, "acquisitions", api, &overlaps, func(ctx context.Context, client int) error {
			l, err := cs[client].Acquire(ctx, key)
			if err != nil {
				return err
			}
			if inside.Add(1) > 1 {
				overlaps.Add(1)
			}
			inside.Add(-1)
			return l.Release(ctx)
		})
	})
	b.Run("takeover", func(b *testing.B) {
		var took []time.Duration
		for i := 0; i < b.N; i++ {
			holderAPI := &faulty{DynamoDBAPI: server}
			holder := newBenchClient(b, holderAPI)
			waiter := newBenchClient(b, server)
			key := freshKey()
			ctx := context.Background()
			if _, err := holder.Acquire(ctx, key); err != nil {
				b.Fatal(err)
			}
			got := make(chan time.Time, 1)
			go func() {
				l, err := waiter.Acquire(ctx, key, dynamolock.WithWait(3*benchLease))
				if err != nil {
					b.Error(err)
					close(got)
					return
				}
				got <- time.Now()
				l.Close()
			}()
			// The waiter polls while heartbeats land; the cut falls at a
			// random point of a heartbeat period, as a crash would.
			time.Sleep(benchHeartbeat + rand.N(benchHeartbeat))
			cut := time.Now()
			holderAPI.blackhole.Store(true)
			at, ok := <-got
			if !ok {
				b.FailNow()
			}
			took = append(took, at.Sub(cut))
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2])/float64(time.Millisecond), "takeover-p50-ms")
		b.ReportMetric(float64(took[len(took)-1])/float64(time.Millisecond), "takeover-max-ms")
	})
}

// measure runs op b.N times over clients goroutines (testenv.RunClients,
// which reports unit/s and p99-ms) and adds p50-ms, calls/op and, if
// overlaps is not nil, overlaps.
func measure(b *testing.B, clients int, unit string, api *counting, overlaps *atomic.Int64, op func(context.Context, int) error) {
	var mu sync.Mutex
	var lat []time.Duration
	before := api.total()
	testenv.RunClients(b, clients, unit, func(ctx context.Context, c int) error {
		t0 := time.Now()
		err := op(ctx, c)
		d := time.Since(t0)
		mu.Lock()
		lat = append(lat, d)
		mu.Unlock()
		return err
	})
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Millisecond), "p50-ms")
	}
	b.ReportMetric(float64(api.total()-before)/float64(b.N), "calls/op")
	if overlaps != nil {
		b.ReportMetric(float64(overlaps.Load()), "overlaps")
		if overlaps.Load() != 0 {
			b.Errorf("%d overlaps", overlaps.Load())
		}
	}
}

// rawTake is the bare conditional write a lock's acquisition needs: take
// the item if it is absent or released. It reports whether it took it.
func rawTake(ctx context.Context, api dynamolock.DynamoDBAPI, table, key string) (bool, string, error) {
	rvn := fmt.Sprint(time.Now().UnixNano())
	_, err := api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: docKey(key),
		UpdateExpression:          aws.String("SET #rvn = :rvn REMOVE #rel"),
		ConditionExpression:       aws.String("attribute_not_exists(#pk) OR #rel = :one"),
		ExpressionAttributeNames:  map[string]string{"#pk": "pk", "#rvn": "rvn", "#rel": "released"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":rvn": &types.AttributeValueMemberS{Value: rvn}, ":one": &types.AttributeValueMemberS{Value: "1"}},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return false, "", nil
	}
	return err == nil, rvn, err
}

// rawRelease is the bare conditional release: mark the item released if it
// still carries rvn.
func rawRelease(ctx context.Context, api dynamolock.DynamoDBAPI, table, key, rvn string) error {
	_, err := api.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: docKey(key),
		UpdateExpression:          aws.String("SET #rel = :one"),
		ConditionExpression:       aws.String("#rvn = :rvn"),
		ExpressionAttributeNames:  map[string]string{"#rvn": "rvn", "#rel": "released"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":rvn": &types.AttributeValueMemberS{Value: rvn}, ":one": &types.AttributeValueMemberS{Value: "1"}},
	})
	return err
}
