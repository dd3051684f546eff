package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/services"
)

// lockTable creates a DynamoDB table for dynamolock and returns its name
// and a cleanup.
func lockTable(ctx context.Context, env *demoEnv) (string, func(), error) {
	table := services.Name("nolock_demo")
	if err := services.CreateTable(ctx, env.dynamo, table, false); err != nil {
		return "", nil, err
	}
	return table, func() { services.DeleteTable(context.WithoutCancel(ctx), env.dynamo, table) }, nil
}

// parcel is the seed's "one parcel, two riders": Asha holds the pickup
// slip (a lease), is stuck past its end, Ravi gets a new slip and collects;
// Asha arrives and collects too. Counter staff who only check "do you have
// a slip?" hand the order over twice; staff who compare slip numbers (the
// fencing token) turn her away.
func parcel(ctx context.Context, env *demoEnv) ([]row, error) {
	const lease = time.Second
	table, drop, err := lockTable(ctx, env)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := env.pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0, rider text);
CREATE TABLE pickups (id int NOT NULL, counter text NOT NULL, rider text NOT NULL);
INSERT INTO orders (id) VALUES (881)`); err != nil {
		return nil, err
	}
	fenced, err := conditional.NewFenced("orders", "id", "fence")
	if err != nil {
		return nil, err
	}
	// collect hands order 881 to a rider at both counters: the one that
	// only checks for a slip, and the one that checks its number.
	collect := func(rider string, slip int64) (fencedErr error, err error) {
		if _, err := env.pool.Exec(ctx, `INSERT INTO pickups VALUES (881, 'checks a slip exists', $1)`, rider); err != nil {
			return nil, err
		}
		fencedErr = pgx.BeginFunc(ctx, env.pool, func(tx pgx.Tx) error {
			if err := fenced.Update(ctx, tx, 881, slip, map[string]any{"rider": rider}); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO pickups VALUES (881, 'checks the slip number', $1)`, rider)
			return err
		})
		if fencedErr != nil && !errors.Is(fencedErr, conditional.ErrFenced) {
			return nil, fencedErr
		}
		return fencedErr, nil
	}

	var stuck atomic.Bool
	asha, err := dynamolock.New(pausable{env.dynamo, &stuck}, table, dynamolock.WithPartitionKeyName("pk"),
		dynamolock.WithLease(lease), dynamolock.WithOwner("asha"))
	if err != nil {
		return nil, err
	}
	defer asha.Close()
	ravi, err := dynamolock.New(env.dynamo, table, dynamolock.WithPartitionKeyName("pk"),
		dynamolock.WithLease(lease), dynamolock.WithOwner("ravi"))
	if err != nil {
		return nil, err
	}
	defer ravi.Close()

	slipA, err := asha.Acquire(ctx, "order-881")
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   asha gets the pickup slip for order 881: slip %d, valid %v\n", slipA.Token(), lease)
	stuck.Store(true) // the level crossing: no signal, her phone cannot renew the slip
	fmt.Fprintf(env.out, "   asha is stuck at a level crossing (paused, no heartbeat reaches the dispatcher)\n")
	start := time.Now()
	slipR, err := ravi.Acquire(ctx, "order-881", dynamolock.WithWait(10*lease))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   after %v the dispatcher gives ravi slip %d; he collects\n", time.Since(start).Round(10*time.Millisecond), slipR.Token())
	if _, err := collect("ravi", slipR.Token()); err != nil {
		return nil, err
	}
	if err := slipR.Release(ctx); err != nil {
		return nil, err
	}
	stuck.Store(false)
	fmt.Fprintf(env.out, "   asha arrives, slip %d in hand, sure the order is hers\n", slipA.Token())
	refused, err := collect("asha", slipA.Token())
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   at the counter that checks slip numbers: %v\n", refused)
	var naive, checked int
	err = env.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE counter = 'checks a slip exists'),
       count(*) FILTER (WHERE counter = 'checks the slip number') FROM pickups`).Scan(&naive, &checked)
	if err != nil {
		return nil, err
	}
	return []row{
		{what: "baseline: lease only, storage checks nothing", outcome: fmt.Sprintf("order 881 handed over %d times", naive), ok: naive == 1},
		{what: "lease + fencing token checked by the row", outcome: fmt.Sprintf("order 881 handed over %d time(s); slip %d refused", checked, slipA.Token()),
			ok: checked == 1 && errors.Is(refused, conditional.ErrFenced)},
	}, nil
}

// pausable fails every call while paused: a holder that is not running
// cannot reach DynamoDB, so its heartbeats stop.
type pausable struct {
	*dynamodb.Client
	paused *atomic.Bool
}

var errPaused = errors.New("paused")

func (p pausable) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if p.paused.Load() {
		return nil, errPaused
	}
	return p.Client.GetItem(ctx, in, o...)
}

func (p pausable) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if p.paused.Load() {
		return nil, errPaused
	}
	return p.Client.UpdateItem(ctx, in, o...)
}

// cron: six replicas wake at 02:00 and try the same lock, named by date;
// exactly one runs the report.
func cron(ctx context.Context, env *demoEnv) ([]row, error) {
	table, drop, err := lockTable(ctx, env)
	if err != nil {
		return nil, err
	}
	defer drop()
	const replicas, nights = 6, 5
	clients := make([]*dynamolock.Client, replicas)
	for i := range clients {
		c, err := dynamolock.New(env.dynamo, table, dynamolock.WithPartitionKeyName("pk"),
			dynamolock.WithLease(2*time.Second), dynamolock.WithOwner(fmt.Sprint("replica-", i+1)))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		clients[i] = c
	}
	runs := map[string]int{}
	var mu sync.Mutex
	for night := 1; night <= nights; night++ {
		date := fmt.Sprintf("2026-12-%02d", night)
		var wg sync.WaitGroup
		errs := make(chan error, replicas)
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l, err := c.TryAcquire(ctx, "nightly-report/"+date)
				if errors.Is(err, dynamolock.ErrNotAcquired) {
					return // another replica has it: nothing to do tonight
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				runs[date]++
				mu.Unlock()
				fmt.Fprintf(env.out, "   %s 02:00: replica-%d runs the report (token %d)\n", date, i+1, l.Token())
				time.Sleep(100 * time.Millisecond) // the report
				errs <- l.Release(ctx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return nil, err
			}
		}
	}
	once := true
	for night := 1; night <= nights; night++ {
		once = once && runs[fmt.Sprintf("2026-12-%02d", night)] == 1
	}
	return []row{{what: "six replicas, one lock per date (dynamolock)",
		outcome: fmt.Sprintf("%d nights, report runs per night: %v", nights, runsPerNight(runs, nights)), ok: once}}, nil
}

func runsPerNight(runs map[string]int, nights int) []int {
	var out []int
	for night := 1; night <= nights; night++ {
		out = append(out, runs[fmt.Sprintf("2026-12-%02d", night)])
	}
	return out
}
