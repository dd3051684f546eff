package partition_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// BenchmarkThroughput applies a backlog spread over 4 partitions, one
// member, at most batch messages per transaction, and reports messages per
// second from the first committed batch to the last, for:
//
//   - fenced: partition.Consumer (claim, fence, handler, offset, one
//     transaction per batch);
//   - bare: kafka-go's ConsumerGroup with one worker per partition, the
//     same reader and batching, and the same per-batch transaction (the
//     handler, then the offset upserted) without claim or fence.
//
// Each iteration runs both back to back, in alternating order, each with a
// fresh group on the same topic. x-bare is the median over iterations of
// fenced's rate over bare's in the same iteration (the machines are shared
// and noisy; a pair run back to back sees the same neighbours). The
// handler inserts one row per message (a multi-row INSERT) into a table
// emptied before each run; times are taken at the commits themselves (a
// wrapped pgx.Tx), not by polling.
func BenchmarkThroughput(b *testing.B) {
	for _, sz := range []struct{ batch, perPartition int }{{100, 25000}, {10, 2500}, {1, 400}} {
		b.Run(fmt.Sprintf("batch=%d", sz.batch), func(b *testing.B) { throughput(b, sz.batch, sz.perPartition) })
	}
}

func throughput(b *testing.B, batch, perPartition int) {
	const benchPartitions = 4
	bd := newBed(b, benchPartitions)
	produce(b, bd.brokers, bd.topic, benchPartitions, 0, perPartition)
	ctx := context.Background()
	if _, err := bd.pool.Exec(ctx, `CREATE TABLE bare_offsets (group_id text, topic text, partition_id int, next_offset bigint,
		PRIMARY KEY (group_id, topic, partition_id)) WITH (fillfactor = 70)`); err != nil {
		b.Fatal(err)
	}
	total := benchPartitions * perPartition
	var took = map[string]time.Duration{}
	var ratios []float64 // per iteration: bare's window / fenced's, run back to back
	run := func(name string) time.Duration {
		if _, err := bd.pool.Exec(ctx, `TRUNCATE results`); err != nil {
			b.Fatal(err)
		}
		group := testenv.Name("g")
		m := &meter{total: int64(total), done: make(chan struct{})}
		db := meteredDB{bd.pool, m}
		cfg := bd.config(name, m.handler(record(name)))
		cfg.group = group
		cfg.with(partition.WithMaxBatch(batch))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		if name == "fenced" {
			c, err := newConsumer(db, cfg)
			if err != nil {
				b.Fatal(err)
			}
			go func() { done <- c.Run(runCtx, cfg.handler) }()
		} else {
			go func() { done <- runBare(runCtx, db, cfg, batch) }()
		}
		var err error
		select {
		case <-m.done:
			err = m.failed
		case <-time.After(2 * time.Minute):
			err = fmt.Errorf("the backlog of %d messages was not applied within 2 minutes", total)
		}
		cancel()
		if rerr := <-done; rerr != nil {
			b.Fatalf("%s: Run: %v", name, rerr)
		}
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		tl, err := count(ctx, bd.pool, benchPartitions, perPartition)
		if err != nil || !tl.exact() || tl.rows != total {
			b.Fatalf("%s: results %v (%v)", name, tl, err)
		}
		d := m.last.Sub(m.first)
		took[name] += d
		return d
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var bare, fenced time.Duration
		if i%2 == 0 {
			bare, fenced = run("bare"), run("fenced")
		} else {
			fenced, bare = run("fenced"), run("bare")
		}
		ratios = append(ratios, bare.Seconds()/fenced.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.Logf("fenced/bare per iteration, sorted: %.3f", ratios)
	b.ReportMetric(float64(b.N*total)/took["fenced"].Seconds(), "fenced-msgs/s")
	b.ReportMetric(float64(b.N*total)/took["bare"].Seconds(), "bare-msgs/s")
	b.ReportMetric(ratios[len(ratios)/2], "x-bare") // the median pair: robust to a noisy neighbour
}

// meter times committed batches: from the first commit of a batch to the
// commit that completes the backlog, without polling the database.
type meter struct {
	total       int64
	mu          sync.Mutex
	applied     int64
	first, last time.Time     // when applied left 0, and when it reached total
	done        chan struct{} // closed when applied reaches total, or on failed
	failed      error         // set before done is closed: the handler got another Tx
}

// handler tells the metered transaction how many messages it carries. A
// handler given any other transaction than the meteredTx its DB began
// ends the run at once: its commits would never be counted.
func (m *meter) handler(h partition.Handler) partition.Handler {
	return func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		mt, ok := tx.(*meteredTx)
		if !ok {
			m.fail(fmt.Errorf("the handler got a %T, not the *meteredTx its DB began", tx))
			return nil
		}
		mt.n = len(msgs)
		return h(ctx, tx, msgs)
	}
}

func (m *meter) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failed == nil && m.last.IsZero() {
		m.failed = err
		close(m.done)
	}
}

func (m *meter) committed(n int) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied == 0 {
		m.first = now
	}
	m.applied += int64(n)
	if m.applied >= m.total && m.last.IsZero() && m.failed == nil {
		m.last = now
		close(m.done)
	}
}

// meteredDB hands out transactions that report their commits to a meter.
type meteredDB struct {
	pool *pgxpool.Pool
	m    *meter
}

func (d meteredDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &meteredTx{Tx: tx, m: d.m}, nil
}

type meteredTx struct {
	pgx.Tx
	m *meter
	n int
}

func (t *meteredTx) Commit(ctx context.Context) error {
	err := t.Tx.Commit(ctx)
	if err == nil && t.n > 0 {
		t.m.committed(t.n)
	}
	return err
}

// runBare is the baseline: a kafka-go ConsumerGroup member with one worker
// per assigned partition reading from the offset it stored, batching like
// partition.Consumer, and committing each batch's handler work and offset
// in one transaction, with no claim and no fence.
func runBare(ctx context.Context, db meteredDB, cfg spec, batch int) error {
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: cfg.group, Brokers: cfg.brokers, Topics: cfg.topics,
		HeartbeatInterval: testHeartbeat, SessionTimeout: testSession,
		RebalanceTimeout: testRebalance, JoinGroupBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			break
		}
		for _, pa := range gen.Assignments[cfg.topics[0]] {
			wg.Add(1)
			gen.Start(func(genCtx context.Context) {
				defer wg.Done()
				if err := bareWorker(genCtx, db, cfg, batch, gen.GroupID, pa); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			})
		}
	}
	_ = cg.Close()
	wg.Wait()
	return failed
}

func bareWorker(genCtx context.Context, db meteredDB, cfg spec, batch int, group string, pa kafka.PartitionAssignment) error {
	topic := cfg.topics[0]
	start := pa.Offset
	var stored *int64
	if err := db.pool.QueryRow(genCtx, `SELECT next_offset FROM bare_offsets WHERE group_id = $1 AND topic = $2 AND partition_id = $3`,
		group, topic, pa.ID).Scan(&stored); err == nil && stored != nil {
		start = *stored
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: cfg.brokers, Topic: topic, Partition: pa.ID, MaxWait: time.Second, QueueCapacity: max(100, batch)})
	defer r.Close()
	if err := r.SetOffset(start); err != nil {
		return err
	}
	for {
		m, err := r.FetchMessage(genCtx)
		if err != nil {
			return nil // the generation ended
		}
		msgs := []kafka.Message{m}
		if r.Lag() > 0 {
			fill, cancel := context.WithTimeout(genCtx, partition.DefaultBatchWait)
			for len(msgs) < batch && r.Lag() > 0 {
				m, err := r.FetchMessage(fill)
				if err != nil {
					break
				}
				msgs = append(msgs, m)
			}
			cancel()
		}
		next := msgs[len(msgs)-1].Offset + 1
		// Like partition.Consumer: the batch's context is bounded (a batch
		// must end before the rebalance timeout) and not cut off by the
		// generation's end.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(genCtx), testBatchTimeout)
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := cfg.handler(ctx, tx, msgs); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO bare_offsets VALUES ($1, $2, $3, $4)
				ON CONFLICT (group_id, topic, partition_id) DO UPDATE SET next_offset = EXCLUDED.next_offset`, group, topic, pa.ID, next)
			return err
		})
		cancel()
		if err != nil {
			return err
		}
	}
}

// BenchmarkHandover kills a member (SIGKILL of a child process) that owns
// one of two partitions and measures the time until the survivor applies
// that partition's next batch, in seconds and in session timeouts.
func BenchmarkHandover(b *testing.B) {
	var total time.Duration
	for i := 0; i < b.N; i++ {
		total += handoverOnce(b)
	}
	avg := total / time.Duration(b.N)
	b.ReportMetric(avg.Seconds(), "handover-s")
	b.ReportMetric(float64(avg)/float64(testSession), "session-timeouts")
}

func handoverOnce(b *testing.B) time.Duration {
	b.StopTimer()
	defer b.StartTimer()
	const parts = 2
	ctx := context.Background()
	bd := newBed(b, parts)
	produce(b, bd.brokers, bd.topic, parts, 0, 3000)
	a := testenv.StartChild(b, "TestChildSlowMember", "SLOW_SCHEMA="+bd.schema, "SLOW_TOPIC="+bd.topic, "SLOW_GROUP="+bd.group)
	out := collectLines(a)
	defer out.stop()
	if _, err := out.await(1, "claimed", time.Minute); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var gen int32
	var mine = map[int]int64{} // B's partitions in generation gen, with their epochs
	var tookOver time.Time
	var killedYet bool
	rec := record("B")
	cfg := bd.config("B", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		cl, _ := partition.FromContext(ctx)
		mu.Lock()
		if _, ok := mine[cl.Partition]; gen > 0 && cl.Generation > gen && !ok && tookOver.IsZero() {
			tookOver = time.Now()
		}
		mu.Unlock()
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithOnClaim(func(cl partition.Claim) {
		mu.Lock()
		defer mu.Unlock()
		if !killedYet && cl.Generation > gen {
			gen, mine = cl.Generation, map[int]int64{}
		}
		if cl.Generation == gen {
			mine[cl.Partition] = cl.Epoch
		}
	}))
	m := startMember(b, bd.pool, cfg)
	// The members split the partitions: A claims one in a generation above
	// 1, and B the other in the same generation.
	claims, err := out.awaitMatching(1, "claimed", time.Minute, func(f map[string]string) bool { return atoi(f["gen"]) >= 2 })
	if err != nil {
		b.Fatal(err)
	}
	aGen, aPart, aEpoch := int32(atoi(claims[0]["gen"])), atoi(claims[0]["p"]), atoi(claims[0]["epoch"])
	var bEpoch int64
	testenv.Until(b, "B claims the other partition in A's generation", func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		if gen > aGen {
			return false, fmt.Errorf("members did not split the partitions in generation %d", aGen)
		}
		bEpoch = mine[1-aPart]
		return gen == aGen && len(mine) == 1 && bEpoch > 0, nil
	})
	// Both working: each member committed a batch under its claim.
	testenv.Until(b, "both members apply their partition", func() (bool, error) {
		var both bool
		err := bd.pool.QueryRow(ctx, `SELECT coalesce(bool_or(member = 'A' AND partition_id = $1 AND epoch = $2), false)
			AND coalesce(bool_or(member = 'B' AND partition_id = $3 AND epoch = $4), false) FROM results`,
			aPart, aEpoch, 1-aPart, bEpoch).Scan(&both)
		return both, err
	})
	mu.Lock()
	killedYet = true
	mu.Unlock()
	a.Kill()
	killed := time.Now()
	deadline := killed.Add(60 * time.Second)
	for {
		mu.Lock()
		t := tookOver
		mu.Unlock()
		if !t.IsZero() {
			if err := m.stop(); err != nil {
				b.Fatal(err)
			}
			return t.Sub(killed)
		}
		if time.Now().After(deadline) {
			b.Fatal("the survivor did not take over within 60 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestChildSlowMember is the member BenchmarkHandover kills: it applies
// its partitions slowly (so a backlog remains) and prints "claimed
// p=<partition> epoch=<epoch> gen=<generation>".
func TestChildSlowMember(t *testing.T) {
	testenv.ChildOnly(t)
	pool := testenv.Pool(t, testenv.PostgresDSNFor(t, os.Getenv("SLOW_SCHEMA")), 4)
	b := &bed{brokers: testenv.Kafka(t), topic: os.Getenv("SLOW_TOPIC"), group: os.Getenv("SLOW_GROUP"), pool: pool}
	rec := record("A")
	cfg := b.config("A", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		time.Sleep(20 * time.Millisecond) // slow work: a backlog remains
		return rec(ctx, tx, msgs)
	})
	cfg.with(partition.WithOnClaim(func(cl partition.Claim) {
		fmt.Printf("claimed p=%d epoch=%d gen=%d\n", cl.Partition, cl.Epoch, cl.Generation)
	}))
	c, err := newConsumer(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.Run(ctx, cfg.handler); err != nil {
		t.Fatal(err)
	}
}
