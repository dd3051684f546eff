package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/partition"
)

// zombie: the owner of a partition stalls inside a batch, holding its
// transaction open, for longer than the group allows. The group hands the
// partition to another member; when the stalled one wakes, its write is
// refused by the epoch stored with the data, and every offset is applied
// once, in order.
func zombie(ctx context.Context, env *demoEnv) ([]row, error) {
	const messages, stallAt, stall = 300, 100, 9 * time.Second
	topic, group := services.Name("nolock_demo"), services.Name("owners")
	if err := services.CreateTopic(ctx, env.brokers, topic, 1); err != nil {
		return nil, err
	}
	defer services.DeleteTopic(context.WithoutCancel(ctx), env.brokers, topic)
	if _, err := env.pool.Exec(ctx, `CREATE TABLE applied ("offset" bigint NOT NULL, member text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		return nil, err
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(env.brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr, BatchSize: 100}
	msgs := make([]kafka.Message, messages)
	for i := range msgs {
		msgs[i].Value = fmt.Appendf(nil, "event-%d", i)
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return nil, err
	}
	w.Close()

	var stalled atomic.Bool
	wake := make(chan struct{})
	var fencedMu sync.Mutex
	var refused []string
	// note records a write of a stalled or fenced owner that was refused.
	note := func(name string, c partition.Claim, err error) {
		fencedMu.Lock()
		defer fencedMu.Unlock()
		refused = append(refused, fmt.Sprintf("%s (epoch %d): %v", name, c.Epoch, err))
	}
	member := func(name string) (*partition.Consumer, error) {
		cfg := partition.DefaultConfig()
		cfg.Brokers, cfg.GroupID, cfg.Topics = env.brokers, group, []string{topic}
		cfg.HeartbeatInterval, cfg.SessionTimeout, cfg.RebalanceTimeout = 300*time.Millisecond, 6*time.Second, 3*time.Second
		cfg.BatchTimeout, cfg.JoinGroupBackoff, cfg.MaxBatch = 2*time.Second, 200*time.Millisecond, 10
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, batch []kafka.Message) error {
			claim, _ := partition.FromContext(ctx)
			if name == "member-a" && batch[0].Offset >= stallAt && stalled.CompareAndSwap(false, true) {
				fmt.Fprintf(env.out, "   member-a (epoch %d) stalls inside its batch at offset %d, transaction open\n", claim.Epoch, batch[0].Offset)
				<-wake // a GC pause, a frozen VM: the transaction stays open
				fmt.Fprintf(env.out, "   member-a wakes and writes offsets %d..%d\n", batch[0].Offset, batch[len(batch)-1].Offset)
			}
			for _, m := range batch {
				if _, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3)`, m.Offset, name, claim.Epoch); err != nil {
					note(name, claim, err)
					return err
				}
			}
			return nil
		}
		cfg.OnRelease = func(c partition.Claim, err error) {
			if errors.Is(err, partition.ErrFenced) {
				note(name, c, err)
			}
		}
		c, err := partition.New(env.pool, cfg)
		if err != nil {
			return nil, err
		}
		return c, c.CreateSchema(ctx)
	}
	a, err := member("member-a")
	if err != nil {
		return nil, err
	}
	b, err := member("member-b")
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	runErrs := make(chan error, 2)
	for _, c := range []*partition.Consumer{a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); runErrs <- c.Run(runCtx) }()
		for !stalled.Load() && c == a {
			time.Sleep(10 * time.Millisecond) // member-b joins only once member-a has stalled
		}
	}
	fmt.Fprintf(env.out, "   member-b joins; member-a misses the rebalance while stalled (%v)\n", stall)
	var done atomic.Int64
	stopProgress := progress(env.out, "offsets applied", &done, messages)
	deadline := time.Now().Add(stall)
	for time.Now().Before(deadline) {
		var n int64
		if err := env.pool.QueryRow(ctx, `SELECT count(DISTINCT "offset") FROM applied`).Scan(&n); err != nil {
			stopProgress()
			return nil, err
		}
		done.Store(n)
		time.Sleep(100 * time.Millisecond)
	}
	stopProgress()
	close(wake)
	time.Sleep(2 * time.Second) // member-a's late write and commit, refused
	stop()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		if err != nil {
			return nil, err
		}
	}
	var rows, distinct, inOrder, late int64
	err = env.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT "offset"),
  count(*) FILTER (WHERE "offset" = rn - 1), count(*) FILTER (WHERE member = 'member-a' AND "offset" >= $1)
FROM (SELECT "offset", member, row_number() OVER (ORDER BY epoch, "offset") AS rn FROM applied) x`, stallAt).Scan(&rows, &distinct, &inOrder, &late)
	if err != nil {
		return nil, err
	}
	fencedMu.Lock()
	defer fencedMu.Unlock()
	for _, r := range refused {
		fmt.Fprintf(env.out, "   refused: %s\n", r)
	}
	fmt.Fprintf(env.out, "   applied: %d rows for %d offsets, %d in order; rows member-a wrote after it stalled: %d\n", rows, distinct, inOrder, late)
	return []row{{what: "paused ex-owner of a partition (epoch fence)",
		outcome: fmt.Sprintf("%d offsets, %d rows, %d in order; the ex-owner's late rows: %d", distinct, rows, inOrder, late),
		ok:      rows == messages && distinct == messages && inOrder == messages && late == 0 && len(refused) > 0}}, nil
}
