// Command nightlycron is the background article's first case: six replicas
// of a service all fire the nightly report at 02:00, and a lock makes one
// of them run it. Each replica calls TryAcquire on a key that names the
// date; the winner runs the job while its lock heartbeats, the others skip.
//
// The second night, the winner crashes mid-job (its process stops talking
// to DynamoDB). The other replicas keep trying every few hundred
// milliseconds until the report exists; one of them takes the lock over
// once it has seen the crashed holder's record version unchanged for a
// full lease of its own clock, and runs the report. Nothing compares the
// replicas' clocks.
//
// This is an efficiency lock: if two replicas ever ran, the report
// overwrites a file named by the date, so a duplicate is harmless.
//
//	go run ./examples/nightlycron [-endpoint http://127.0.0.1:18000] [-replicas 6] [-nights 3]
//
// The endpoint defaults to $NOLOCK_TEST_DYNAMODB (see scripts/services).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
)

const lease = 2 * time.Second

func main() {
	endpoint := flag.String("endpoint", os.Getenv("NOLOCK_TEST_DYNAMODB"), "DynamoDB endpoint URL")
	replicas := flag.Int("replicas", 6, "replicas firing the job")
	nights := flag.Int("nights", 3, "nights to run")
	flag.Parse()
	if err := run(context.Background(), *endpoint, *replicas, *nights); err != nil {
		log.Fatal(err)
	}
}

// reports stands for the report files, named by date: written at most
// once per date, however many replicas run.
type reports struct {
	mu      sync.Mutex
	written map[string]string // date -> replica
	runs    map[string]int    // date -> how many times the job ran
}

func (r *reports) done(date string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.written[date]
	return ok
}

func (r *reports) write(date, replica string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.written[date] = replica
	r.runs[date]++
}

func run(ctx context.Context, endpoint string, replicas, nights int) error {
	if endpoint == "" {
		return errors.New("no -endpoint and no NOLOCK_TEST_DYNAMODB: run scripts/services up, then eval \"$(scripts/services env)\"")
	}
	db := services.DynamoDBClient(endpoint, nil)
	table := fmt.Sprintf("nolock_cron_%d", time.Now().UnixNano())
	if err := services.CreateTableKeyed(ctx, db, table, "key"); err != nil { // dynamolock's default key name
		return err
	}
	defer services.DeleteTable(context.Background(), db, table)

	// Each replica has its own client, as each would in its own process.
	// crashed[i] cuts replica i off from DynamoDB, like a process that died.
	clients := make([]*dynamolock.Client, replicas)
	crashed := make([]*atomic.Bool, replicas)
	for i := range clients {
		crashed[i] = new(atomic.Bool)
		c, err := dynamolock.New(cutOff{db, crashed[i]}, table,
			dynamolock.WithLease(lease), dynamolock.WithOwner(fmt.Sprintf("replica-%d", i+1)))
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}

	out := &reports{written: map[string]string{}, runs: map[string]int{}}
	for night := 1; night <= nights; night++ {
		date := fmt.Sprintf("2026-10-%02d", 26+night)
		crashNext := new(atomic.Bool) // on night 2, the first winner crashes
		crashNext.Store(night == 2)
		start := time.Now()
		var wg sync.WaitGroup
		var skipped atomic.Int64
		for i, c := range clients {
			if crashed[i].Load() {
				continue // a crashed replica is gone for good
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				replica(ctx, c, i, date, crashNext, crashed[i], start, out, &skipped)
			}()
		}
		wg.Wait()
		fmt.Printf("night %s: report written by %s, job ran %d time(s), %d attempts skipped (lock held)\n\n",
			date, out.written[date], out.runs[date], skipped.Load())
	}
	return nil
}

// replica is one replica's 02:00 timer: try the lock named by the date;
// retry while no report exists, so a crashed winner is replaced.
func replica(ctx context.Context, c *dynamolock.Client, i int, date string, crashNext, crashed *atomic.Bool,
	start time.Time, out *reports, skipped *atomic.Int64) {
	name := fmt.Sprintf("replica-%d", i+1)
	for time.Since(start) < 3*lease && !out.done(date) {
		l, err := c.TryAcquire(ctx, "nightly-report/"+date, dynamolock.WithMaxHold(time.Minute))
		var held *dynamolock.HeldError
		switch {
		case errors.As(err, &held):
			skipped.Add(1)
			time.Sleep(300 * time.Millisecond)
			continue
		case err != nil:
			log.Printf("%s: %v", name, err)
			return
		}
		fmt.Printf("  %s took the lock (token %d) after %v; running the report\n", name, l.Token(), time.Since(start).Round(10*time.Millisecond))
		if crashNext.CompareAndSwap(true, false) {
			crashed.Store(true) // dies mid-job: no report, no release, no more heartbeats
			fmt.Printf("  %s crashed mid-job\n", name)
			<-l.Lost() // its heartbeat goroutine notices, one lease later
			return
		}
		select {
		case <-time.After(500 * time.Millisecond): // the job
			out.write(date, name)
			fmt.Printf("  %s wrote report-%s.csv\n", name, date)
		case <-l.Lost():
			fmt.Printf("  %s lost the lock mid-job: %v\n", name, l.Err())
		}
		l.Release(ctx)
		return
	}
}

// cutOff is a replica's connection to DynamoDB, which fails once the
// replica has crashed.
type cutOff struct {
	*dynamodb.Client
	crashed *atomic.Bool
}

var errCrashed = errors.New("replica crashed")

func (c cutOff) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if c.crashed.Load() {
		return nil, errCrashed
	}
	return c.Client.GetItem(ctx, in, o...)
}

func (c cutOff) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if c.crashed.Load() {
		return nil, errCrashed
	}
	return c.Client.UpdateItem(ctx, in, o...)
}

func (c cutOff) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if c.crashed.Load() {
		return nil, errCrashed
	}
	return c.Client.DeleteItem(ctx, in, o...)
}
