package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/seam"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/partition"
)

// zombie: the owner of a partition stalls with a batch in hand, before the
// batch's transaction begins, for longer than the group allows. The group
// hands the partition to another member, which claims a higher epoch and
// applies the rest. When the stalled one wakes, it begins its batch's
// transaction with a live context, and the epoch fence refuses it by name
// (partition.ErrFenced); every offset is applied once, in order.
func zombie(ctx context.Context, env *demoEnv) ([]row, error) {
	const messages, stallAt = 300, 100
	topic, group := services.Name("nolock_demo"), services.Name("owners")
	if err := services.CreateTopic(ctx, env.brokers, topic, 1); err != nil {
		return nil, err
	}
	defer services.DeleteTopic(context.WithoutCancel(ctx), env.brokers, topic)
	if _, err := env.pool.Exec(ctx, `CREATE TABLE applied ("offset" bigint NOT NULL, member text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		return nil, err
	}
	if err := produceEvents(ctx, env.brokers, topic, messages); err != nil {
		return nil, err
	}
	sc := newZombieScene(env.out)
	a, err := sc.member(ctx, env, "member-a", group, topic, stallAt)
	if err != nil {
		return nil, err
	}
	b, err := sc.member(ctx, env, "member-b", group, topic, stallAt)
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	runErrs := make(chan error, 2)
	run := func(member func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); runErrs <- member(runCtx) }()
	}
	run(a)
	if _, err := await(ctx, sc.paused, time.Minute, "member-a to stall"); err != nil {
		return nil, err
	}
	run(b) // member-b joins only once member-a has stalled
	fmt.Fprintln(env.out, "   member-b joins; member-a, stalled, misses the rebalance and is dropped from the group")
	if err := waitApplied(ctx, env, messages); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.out, "   member-b (epoch %d) has applied every offset up to %d\n", sc.epochOf("member-b"), messages-1)
	close(sc.wake)
	lateErr, err := await(ctx, sc.lateRefused, time.Minute, "member-a's late transaction to end")
	if err != nil {
		return nil, err
	}
	byFence := errors.Is(lateErr, partition.ErrFenced) && !errors.Is(lateErr, context.DeadlineExceeded)
	fmt.Fprintf(env.out, "   member-a's late transaction, context live, refused by the epoch fence: %v\n", lateErr)
	fmt.Fprintf(env.out, "   errors.Is(err, partition.ErrFenced): %v\n", errors.Is(lateErr, partition.ErrFenced))
	stop()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		if err != nil {
			return nil, err
		}
	}
	return sc.verdict(ctx, env, messages, stallAt, byFence)
}

// zombieScene is the state the scene's members share.
type zombieScene struct {
	out         io.Writer
	stalled     atomic.Bool
	paused      chan struct{} // closed once member-a stalls
	wake        chan struct{} // closed to wake member-a
	lateRefused chan error    // member-a's release after it woke
	mu          sync.Mutex
	epochs      map[string]int64 // each member's last claim
	refused     []string         // writes of the members that were refused
}

func newZombieScene(out io.Writer) *zombieScene {
	return &zombieScene{out: out, paused: make(chan struct{}), wake: make(chan struct{}),
		lateRefused: make(chan error, 1), epochs: map[string]int64{}}
}

// member returns the run of the Consumer named name. member-a stalls before the
// transaction of its first batch at or after offset stallAt, until wake
// is closed: it holds no transaction and no lock meanwhile.
func (sc *zombieScene) member(ctx context.Context, env *demoEnv, name, group, topic string, stallAt int64) (func(context.Context) error, error) {
	opts := []partition.Option{
		partition.WithHeartbeatInterval(300 * time.Millisecond), partition.WithSessionTimeout(6 * time.Second),
		partition.WithRebalanceTimeout(3 * time.Second), partition.WithBatchTimeout(2 * time.Second),
		partition.WithJoinGroupBackoff(200 * time.Millisecond), partition.WithMaxBatch(10),
		partition.WithObserver(env.obs),
	}
	apply := func(ctx context.Context, tx pgx.Tx, batch []kafka.Message) error {
		claim, _ := partition.FromContext(ctx)
		for _, m := range batch {
			if _, err := tx.Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3)`, m.Offset, name, claim.Epoch); err != nil {
				sc.note(name, claim, err)
				return err
			}
		}
		return nil
	}
	// member-a's stall, called before each attempt's transaction begins
	// (internal/seam: the public API has no such hook).
	var beforeBatch func(context.Context, []kafka.Message)
	if name == "member-a" {
		beforeBatch = func(ctx context.Context, batch []kafka.Message) {
			c, _ := partition.FromContext(ctx)
			if batch[0].Offset < stallAt || !sc.stalled.CompareAndSwap(false, true) {
				return
			}
			first, last := batch[0].Offset, batch[len(batch)-1].Offset
			fmt.Fprintf(sc.out, "   member-a (epoch %d) stalls holding offsets %d..%d, before their transaction begins (no transaction open, no lock held)\n", c.Epoch, first, last)
			close(sc.paused)
			<-sc.wake // a GC pause, a frozen VM
			fmt.Fprintf(sc.out, "   member-a wakes and begins the transaction for offsets %d..%d, with a fresh batch timeout\n", first, last)
		}
	}
	opts = append(opts, partition.WithOnClaim(func(c partition.Claim) {
		sc.mu.Lock()
		defer sc.mu.Unlock()
		sc.epochs[name] = c.Epoch
	}), partition.WithOnRelease(func(c partition.Claim, err error) {
		if errors.Is(err, partition.ErrFenced) {
			sc.note(name, c, err)
		}
		if name == "member-a" && sc.stalled.Load() {
			select {
			case sc.lateRefused <- err:
			default:
			}
		}
	}))
	c, err := partition.New(env.pool, env.brokers, group, []string{topic}, opts...)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if beforeBatch != nil {
			ctx = seam.WithBeforeBatch(ctx, beforeBatch)
		}
		return c.Run(ctx, apply)
	}, c.CreateSchema(ctx)
}

// note records a write of a stalled or fenced owner that was refused.
func (sc *zombieScene) note(name string, c partition.Claim, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.refused = append(sc.refused, fmt.Sprintf("%s (epoch %d): %v", name, c.Epoch, err))
}

func (sc *zombieScene) epochOf(name string) int64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.epochs[name]
}

// verdict counts what applied holds and prints the refused writes.
func (sc *zombieScene) verdict(ctx context.Context, env *demoEnv, messages, stallAt int64, byFence bool) ([]row, error) {
	var rows, distinct, inOrder, late int64
	err := env.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT "offset"),
  count(*) FILTER (WHERE "offset" = rn - 1), count(*) FILTER (WHERE member = 'member-a' AND "offset" >= $1)
FROM (SELECT "offset", member, row_number() OVER (ORDER BY epoch, "offset") AS rn FROM applied) x`, stallAt).Scan(&rows, &distinct, &inOrder, &late)
	if err != nil {
		return nil, err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, r := range sc.refused {
		fmt.Fprintf(env.out, "   refused: %s\n", r)
	}
	fmt.Fprintf(env.out, "   applied: %d rows for %d offsets, %d in order; rows member-a wrote after it stalled: %d\n", rows, distinct, inOrder, late)
	refusal := "refused by partition.ErrFenced"
	if !byFence {
		refusal = "NOT refused by the fence"
	}
	return []row{{what: "paused ex-owner of a partition (epoch fence)",
		outcome: fmt.Sprintf("%d offsets, %d rows, %d in order; the ex-owner's late rows: %d, its late batch %s", distinct, rows, inOrder, late, refusal),
		ok:      rows == messages && distinct == messages && inOrder == messages && late == 0 && byFence}}, nil
}

// produceEvents writes n messages "event-i" to topic.
func produceEvents(ctx context.Context, brokers []string, topic string, n int) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr, BatchSize: 100}
	defer w.Close()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i].Value = fmt.Appendf(nil, "event-%d", i)
	}
	return w.WriteMessages(ctx, msgs...)
}

// waitApplied waits until applied holds every one of n offsets, showing
// progress, for at most two minutes.
func waitApplied(ctx context.Context, env *demoEnv, n int64) error {
	var done atomic.Int64
	stopProgress := progress(env.out, "offsets applied", &done, n)
	defer stopProgress()
	deadline := time.Now().Add(2 * time.Minute)
	for done.Load() < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d offsets applied after 2 minutes", done.Load(), n)
		}
		var got int64
		if err := env.pool.QueryRow(ctx, `SELECT count(DISTINCT "offset") FROM applied`).Scan(&got); err != nil {
			return err
		}
		done.Store(got)
		if got < n {
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// await waits for a value on ch (or ch closed), for at most d.
func await[T any](ctx context.Context, ch <-chan T, d time.Duration, what string) (T, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	var zero T
	select {
	case v := <-ch:
		return v, nil
	case <-t.C:
		return zero, fmt.Errorf("waited %v for %s", d, what)
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}
