// Package pausedowner is the paused owner of a Kafka partition, fenced by
// its epoch: the story `nolock demo` tells as "paused partition owner".
//
// One member of a consumer group (partition.Consumer) owns a partition and
// stalls with a batch in hand, before the batch's transaction begins, for
// longer than the group allows (a GC pause, a frozen VM). The group hands
// the partition to another member, which claims a higher epoch and applies
// the rest. When the stalled one wakes, it begins its batch's transaction
// with a live context, and the epoch fence refuses it by name
// (partition.ErrFenced): every offset is applied once, in order.
package pausedowner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/seam"
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/observe"
	"github.com/nolock/nolock/partition"
)

// Config is where and how the story runs.
type Config struct {
	Brokers  []string         // Kafka; the story's topic is made and deleted
	DSN      string           // PostgreSQL; the story's table is made and dropped in its search_path
	Messages int64            // messages on the partition
	StallAt  int64            // member-a stalls at the first batch at or after this offset (0 < StallAt < Messages)
	Out      io.Writer        // the transcript
	Observer observe.Observer // receives the library's events (nil: none)
}

// Report is what the story measured.
type Report struct {
	Rows, Distinct, InOrder int64 // rows applied, distinct offsets among them, rows in offset order
	Late                    int64 // rows member-a wrote after it stalled (0 unless the fence failed)
	ByFence                 bool  // member-a's late transaction was refused by partition.ErrFenced, its context live
	LateErr                 error // what member-a's late transaction returned
}

// Held reports whether the story's invariant held: every offset applied
// once, in order, and the paused owner refused by the fence.
func (r Report) Held(messages int64) bool {
	return r.Rows == messages && r.Distinct == messages && r.InOrder == messages && r.Late == 0 && r.ByFence
}

// Run tells the story and returns its report, or an error if it could not
// run; check Report.Held for the invariant.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if len(cfg.Brokers) == 0 || cfg.StallAt <= 0 || cfg.Messages <= cfg.StallAt || cfg.Out == nil {
		return Report{}, errors.New("pausedowner: need brokers, 0 < StallAt < Messages, and an Out")
	}
	pool, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	topic, group := services.Name("nolock_demo"), services.Name("owners")
	if err := services.CreateTopic(ctx, cfg.Brokers, topic, 1); err != nil {
		return Report{}, err
	}
	defer services.DeleteTopic(context.WithoutCancel(ctx), cfg.Brokers, topic)
	table := pgx.Identifier{services.Name("pausedowner_applied")}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` ("offset" bigint NOT NULL, member text NOT NULL, epoch bigint NOT NULL)`); err != nil {
		return Report{}, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE `+table)
	if err := produceEvents(ctx, cfg.Brokers, topic, int(cfg.Messages)); err != nil {
		return Report{}, err
	}
	sc := &scene{cfg: cfg, pool: pool, table: table, paused: make(chan struct{}), wake: make(chan struct{}),
		lateRefused: make(chan error, 1), epochs: map[string]int64{}}
	a, err := sc.member(ctx, "member-a", group, topic)
	if err != nil {
		return Report{}, err
	}
	b, err := sc.member(ctx, "member-b", group, topic)
	if err != nil {
		return Report{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	runErrs := make(chan error, 2)
	run := func(member func(context.Context) error) {
		wg.Go(func() { runErrs <- member(runCtx) })
	}
	run(a)
	if _, err := await(ctx, sc.paused, time.Minute, "member-a to stall"); err != nil {
		return Report{}, err
	}
	run(b) // member-b joins only once member-a has stalled
	fmt.Fprintln(cfg.Out, "   member-b joins; member-a, stalled, misses the rebalance and is dropped from the group")
	if err := sc.waitApplied(ctx); err != nil {
		return Report{}, err
	}
	fmt.Fprintf(cfg.Out, "   member-b (epoch %d) has applied every offset up to %d\n", sc.epochOf("member-b"), cfg.Messages-1)
	close(sc.wake)
	lateErr, err := await(ctx, sc.lateRefused, time.Minute, "member-a's late transaction to end")
	if err != nil {
		return Report{}, err
	}
	rep := Report{LateErr: lateErr, ByFence: errors.Is(lateErr, partition.ErrFenced) && !errors.Is(lateErr, context.DeadlineExceeded)}
	fmt.Fprintf(cfg.Out, "   member-a's late transaction, context live, refused by the epoch fence: %v\n", lateErr)
	fmt.Fprintf(cfg.Out, "   errors.Is(err, partition.ErrFenced): %v\n", errors.Is(lateErr, partition.ErrFenced))
	stop()
	wg.Wait()
	close(runErrs)
	for err := range runErrs {
		if err != nil {
			return rep, err
		}
	}
	return rep, sc.verdict(ctx, &rep)
}

// scene is the state the story's members share.
type scene struct {
	cfg         Config
	pool        *pgxpool.Pool
	table       string // the applied rows', quoted
	stalled     atomic.Bool
	paused      chan struct{} // closed once member-a stalls
	wake        chan struct{} // closed to wake member-a
	lateRefused chan error    // member-a's release after it woke
	mu          sync.Mutex
	epochs      map[string]int64 // each member's last claim
	refused     []string         // writes of the members that were refused
}

// member returns the run of the Consumer named name. member-a stalls before the
// transaction of its first batch at or after offset StallAt, until wake
// is closed: it holds no transaction and no lock meanwhile.
func (sc *scene) member(ctx context.Context, name, group, topic string) (func(context.Context) error, error) {
	opts := []partition.Option{
		partition.WithHeartbeatInterval(300 * time.Millisecond), partition.WithSessionTimeout(6 * time.Second),
		partition.WithRebalanceTimeout(3 * time.Second), partition.WithBatchTimeout(2 * time.Second),
		partition.WithJoinGroupBackoff(200 * time.Millisecond), partition.WithMaxBatch(10),
		partition.WithObserver(sc.cfg.Observer),
	}
	apply := func(ctx context.Context, tx pgx.Tx, batch []kafka.Message) error {
		claim, _ := partition.FromContext(ctx)
		for _, m := range batch {
			if _, err := tx.Exec(ctx, `INSERT INTO `+sc.table+` VALUES ($1, $2, $3)`, m.Offset, name, claim.Epoch); err != nil {
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
			if batch[0].Offset < sc.cfg.StallAt || !sc.stalled.CompareAndSwap(false, true) {
				return
			}
			first, last := batch[0].Offset, batch[len(batch)-1].Offset
			fmt.Fprintf(sc.cfg.Out, "   member-a (epoch %d) stalls holding offsets %d..%d, before their transaction begins (no transaction open, no lock held)\n", c.Epoch, first, last)
			close(sc.paused)
			<-sc.wake // a GC pause, a frozen VM
			fmt.Fprintf(sc.cfg.Out, "   member-a wakes and begins the transaction for offsets %d..%d, with a fresh batch timeout\n", first, last)
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
	c, err := partition.New(sc.pool, sc.cfg.Brokers, group, []string{topic}, opts...)
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
func (sc *scene) note(name string, c partition.Claim, err error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.refused = append(sc.refused, fmt.Sprintf("%s (epoch %d): %v", name, c.Epoch, err))
}

func (sc *scene) epochOf(name string) int64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.epochs[name]
}

// verdict counts what the table holds into rep and prints the refused
// writes.
func (sc *scene) verdict(ctx context.Context, rep *Report) error {
	err := sc.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT "offset"),
  count(*) FILTER (WHERE "offset" = rn - 1), count(*) FILTER (WHERE member = 'member-a' AND "offset" >= $1)
FROM (SELECT "offset", member, row_number() OVER (ORDER BY epoch, "offset") AS rn FROM `+sc.table+`) x`, sc.cfg.StallAt).Scan(&rep.Rows, &rep.Distinct, &rep.InOrder, &rep.Late)
	if err != nil {
		return err
	}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, r := range sc.refused {
		fmt.Fprintf(sc.cfg.Out, "   refused: %s\n", r)
	}
	fmt.Fprintf(sc.cfg.Out, "   applied: %d rows for %d offsets, %d in order; rows member-a wrote after it stalled: %d\n", rep.Rows, rep.Distinct, rep.InOrder, rep.Late)
	return nil
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

// waitApplied waits until the table holds every offset, printing progress
// every second, for at most two minutes.
func (sc *scene) waitApplied(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	shown := time.Now()
	for {
		var got int64
		if err := sc.pool.QueryRow(ctx, `SELECT count(DISTINCT "offset") FROM `+sc.table).Scan(&got); err != nil {
			return err
		}
		switch {
		case got >= sc.cfg.Messages:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("%d of %d offsets applied after 2 minutes", got, sc.cfg.Messages)
		case time.Since(shown) >= time.Second:
			fmt.Fprintf(sc.cfg.Out, "   … offsets applied: %d/%d\n", got, sc.cfg.Messages)
			shown = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
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
