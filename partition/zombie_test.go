package partition_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// The zombie scenario, on the real broker, with a real process. One round
// runs one trial per partition of a fresh topic, all at once:
//
//  1. Member A (a child process) owns every partition and applies each
//     from offset 0.
//  2. At its first batch from offset zombieAt on, each of A's workers
//     stops at its pause point: before the batch's transaction (pause
//     "fence": it holds the messages but has not written), or inside the
//     handler (pause "handler": its transaction is open, fence passed,
//     rows inserted, the partition's row locked). Once every worker is
//     there, A is frozen with SIGSTOP.
//  3. Member B (this process) joins. The coordinator drops A, B claims
//     every partition and applies it from where A's committed batches
//     end. A stays frozen past the session timeout.
//  4. A resumes and each worker goes on with its batch: it tries to write
//     and commit.
//
// With the fence, every late write of A's is refused and results holds
// every offset exactly once, in order. Pause "fence": A's transaction
// begins after B's claim and its fence refuses it (ErrFenced). Pause
// "handler": A's open transaction holds the partition's row lock, so B's
// claim waits until PostgreSQL ends A's session
// (idle_in_transaction_session_timeout = BatchTimeout); A's commit then
// fails, and its retry, if its generation has not ended first, is fenced.
// Either way no row of A's from the paused batch on commits.
//
// Without the fence (a control round, every pause "fence", where the fence
// is the only guard) the same round applies A's batches a second time, out
// of order: the count catches it, so this test can fail.

const (
	zombiePerPartition = 40
	zombieAt           = 20
)

// zombiePause is where A's worker for partition p stops: inside the
// handler for one partition in four (each holds a connection with its
// transaction open), before the transaction for the others; always before
// it when the fence is off, where the fence is the only guard.
func zombiePause(p int, unfenced bool) string {
	if p%4 == 1 && !unfenced {
		return "handler"
	}
	return "fence"
}

// Every trial must end exact, with A's late write refused; every trial of
// the control round, where A's fence is off, must be caught. The stress
// mode runs 10 rounds of 100 partitions, two rounds at a time, and a
// control round of 20.
func TestZombie(t *testing.T) {
	t.Parallel()
	rounds, parts := testenv.Trials(1, 10), testenv.Trials(4, 100)
	results, control := runZombieRounds(t, rounds, parts, testenv.Trials(2, 20))
	var n, inHandler, late, fenced, cutOff, inexact int
	for _, r := range results {
		if r.err != nil {
			t.Errorf("trial %s (pause in %s): %v", r.name, r.pauseIn, r.err)
			continue
		}
		n++
		if r.pauseIn == "handler" {
			inHandler++
		}
		if !r.tally.exact() || r.tally.rows != zombiePerPartition {
			inexact++
			t.Errorf("trial %s (pause in %s): results %v; want %d rows, each offset once, in order", r.name, r.pauseIn, r.tally, zombiePerPartition)
		}
		if r.zombieRows != 0 {
			late++
			t.Errorf("trial %s (pause in %s): %d rows of the zombie's from offset %d on committed", r.name, r.pauseIn, r.zombieRows, r.pauseOffset)
		}
		switch {
		case errors.Is(r.release, partition.ErrFenced):
			fenced++
		case r.pauseIn == "fence":
			t.Errorf("trial %s (pause in fence): the resumed member was not fenced: %v", r.name, r.release)
		default:
			cutOff++ // its commit failed, and its generation ended before a retry
		}
		if r.epochB <= r.epochA {
			t.Errorf("trial %s: B claimed epoch %d, not above A's %d", r.name, r.epochB, r.epochA)
		}
		if r.paused < testSession {
			t.Errorf("trial %s: A was paused %v, not past the session timeout %v", r.name, r.paused, testSession)
		}
	}
	testenv.Figures(t, "partition zombie", "%d trials, %d late writes accepted, %d refused by the epoch fence, %d cut off with their session before a retry (of %d paused inside the transaction), %d partitions not exact, %d trials failed to run",
		n, late, fenced, cutOff, inHandler, inexact, len(results)-n)

	caught := 0
	for _, r := range control {
		switch {
		case r.err != nil:
			t.Errorf("control trial %s: %v", r.name, r.err)
		case r.tally.exact():
			t.Errorf("control trial %s, no fence: the zombie's write went unnoticed: %v", r.name, r.tally)
		default:
			caught++
		}
	}
	t.Logf("%d control trials without the fence: %d caught applying offsets twice or out of order", len(control), caught)
}

// zombieResult is what one trial (one partition of a round) saw.
type zombieResult struct {
	name           string // round/partition
	pauseIn        string
	pauseOffset    int64
	zombieRows     int   // A's rows from pauseOffset on
	tally          tally // the partition's results
	release        error // how A's paused worker ended
	epochA, epochB int64 // A's paused claim, B's first claim
	paused         time.Duration
	err            error
}

// runZombieRounds runs rounds of parts trials each, two rounds at a time,
// and a control round of controlParts trials without the fence, alongside
// the first two. Each wave of rounds is a subtest, so its topics, schemas
// and children are released before the next; within it the rounds run
// concurrently, set up on the subtest's goroutine and reporting through
// their results.
func runZombieRounds(t *testing.T, rounds, parts, controlParts int) (results, control []zombieResult) {
	var mu sync.Mutex
	const wave = 2
	for start := 0; start < rounds; start += wave {
		t.Run(fmt.Sprintf("rounds_%d-%d", start, min(rounds, start+wave)-1), func(t *testing.T) {
			var wg sync.WaitGroup
			run := func(name string, z *zombieRound, into *[]zombieResult) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rs := z.run()
					for j := range rs {
						rs[j].name = fmt.Sprintf("%s/%d", name, j)
					}
					mu.Lock()
					defer mu.Unlock()
					*into = append(*into, rs...)
				}()
			}
			for i := start; i < min(rounds, start+wave); i++ {
				run(fmt.Sprint(i), newZombieRound(t, parts, false), &results)
			}
			if start == 0 {
				run("control", newZombieRound(t, controlParts, true), &control)
			}
			wg.Wait()
		})
	}
	return results, control
}

// zombieRound is one round: its world, member A's process, and member B,
// set up (step 1) but not yet running.
type zombieRound struct {
	t      *testing.T
	b      *bed
	a      *testenv.Child
	bc     *partition.Consumer
	parts  int
	mu     sync.Mutex
	epochB map[int]int64 // B's first claim per partition
}

// newZombieRound sets a round up, on the test's goroutine.
func newZombieRound(t *testing.T, parts int, unfenced bool) *zombieRound {
	z := &zombieRound{t: t, b: newBed(t, parts), parts: parts, epochB: map[int]int64{}}
	b := z.b
	produce(t, b.brokers, b.topic, parts, 0, zombiePerPartition)
	env := []string{"ZOMBIE_SCHEMA=" + b.schema, "ZOMBIE_TOPIC=" + b.topic, "ZOMBIE_GROUP=" + b.group, "ZOMBIE_PARTITIONS=" + strconv.Itoa(parts)}
	if unfenced {
		env = append(env, "ZOMBIE_UNFENCED=1")
	}
	z.a = testenv.StartChild(t, "TestChildZombie", env...)
	cfg := b.config("B", nil)
	cfg.with(partition.WithOnClaim(func(cl partition.Claim) {
		z.mu.Lock()
		defer z.mu.Unlock()
		if z.epochB[cl.Partition] == 0 {
			z.epochB[cl.Partition] = cl.Epoch
		}
	}))
	var err error
	if z.bc, err = newConsumer(b.pool, cfg); err != nil {
		t.Fatal(err)
	}
	return z
}

// run runs steps 2-4, on any goroutine, and counts each partition's
// results; an error that stops the round is reported in every trial.
func (z *zombieRound) run() []zombieResult {
	b, a, parts := z.b, z.a, z.parts
	rs := make([]zombieResult, parts)
	fail := func(err error) []zombieResult {
		for p := range rs {
			rs[p].err = err
		}
		return rs
	}
	ctx := context.Background()
	out := collectLines(a)
	defer out.stop()

	// Step 2: every worker at its pause point, then SIGSTOP.
	pauses, err := out.await(parts, "pause-point", time.Minute)
	if err != nil {
		return fail(err)
	}
	for _, f := range pauses {
		p := atoi(f["p"])
		rs[p].pauseIn, rs[p].pauseOffset, rs[p].epochA = f["in"], int64(atoi(f["offset"])), int64(atoi(f["epoch"]))
	}
	a.Pause()
	pausedAt := time.Now()

	// Step 3: B takes over and applies everything.
	bm := runMember(z.t, z.bc, record("B"))
	err = waitRows(ctx, b.pool, parts*zombiePerPartition)
	if err == nil {
		time.Sleep(time.Until(pausedAt.Add(testSession + 500*time.Millisecond))) // the fault: stay frozen past the session timeout
	}
	paused := time.Since(pausedAt)
	a.Resume()
	if err != nil {
		return fail(err)
	}

	// Step 4: each paused worker tries its late write and releases.
	releases, err := out.awaitMatching(parts, "released", time.Minute, func(f map[string]string) bool {
		p := atoi(f["p"])
		return p < parts && int64(atoi(f["epoch"])) == rs[p].epochA
	})
	if err != nil {
		return fail(err)
	}
	for _, f := range releases {
		p := atoi(f["p"])
		if f["fenced"] == "true" {
			rs[p].release = partition.ErrFenced
		} else if f["err"] != "<nil>" {
			rs[p].release = errors.New(f["err"])
		}
	}
	if err := bm.stop(); err != nil {
		return fail(fmt.Errorf("B's Run: %w", err))
	}
	a.Kill()
	each, err := countEach(ctx, b.pool, parts, zombiePerPartition)
	if err != nil {
		return fail(err)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	for p := range rs {
		rs[p].tally, rs[p].epochB, rs[p].paused = each[p], z.epochB[p], paused
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE member = 'A' AND partition_id = $1 AND msg_offset >= $2`,
			p, rs[p].pauseOffset).Scan(&rs[p].zombieRows); err != nil {
			rs[p].err = err
		}
	}
	return rs
}

// TestChildZombie is member A's process (see TestZombie). It owns every
// partition of its topic. Each worker stops at its pause point (see
// zombiePause) in its first batch from zombieAt on, prints "pause-point
// p=<partition> offset=<first offset> epoch=<epoch> in=<fence|handler>"
// and waits there until the process has been stopped and continued
// (SIGCONT). It also prints "released p=<partition> epoch=<epoch>
// fenced=<bool> err=<error>" whenever a worker stops.
func TestChildZombie(t *testing.T) {
	testenv.ChildOnly(t)
	schema := os.Getenv("ZOMBIE_SCHEMA")
	unfenced := os.Getenv("ZOMBIE_UNFENCED") != ""
	b := &bed{brokers: testenv.Kafka(t), topic: os.Getenv("ZOMBIE_TOPIC"), group: os.Getenv("ZOMBIE_GROUP"), schema: schema}
	// One connection per worker paused inside its transaction, and a few
	// for the others.
	inside := 0
	for p := range atoi(os.Getenv("ZOMBIE_PARTITIONS")) {
		if zombiePause(p, unfenced) == "handler" {
			inside++
		}
	}
	b.pool = testenv.Pool(t, testenv.PostgresDSNFor(t, schema), int32(inside+4))

	continued := make(chan os.Signal, 1)
	signal.Notify(continued, syscall.SIGCONT)
	defer signal.Stop(continued)
	resumed := make(chan struct{})
	go func() { <-continued; close(resumed) }()

	var mu sync.Mutex
	pausedOnce := map[int]bool{}
	pausePoint := func(where string, cl partition.Claim, msgs []kafka.Message) {
		if msgs[0].Offset < zombieAt || zombiePause(cl.Partition, unfenced) != where {
			return
		}
		mu.Lock()
		first := !pausedOnce[cl.Partition]
		pausedOnce[cl.Partition] = true
		mu.Unlock()
		if first {
			fmt.Printf("pause-point p=%d offset=%d epoch=%d in=%s\n", cl.Partition, msgs[0].Offset, cl.Epoch, where)
			<-resumed // the parent stops us here, then continues us
		}
	}
	rec := record("A")
	cfg := b.config("A", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if err := rec(ctx, tx, msgs); err != nil {
			return err
		}
		cl, _ := partition.FromContext(ctx)
		pausePoint("handler", cl, msgs)
		return nil
	})
	cfg.with(partition.WithOnRelease(func(cl partition.Claim, err error) {
		fmt.Printf("released p=%d epoch=%d fenced=%v err=%s\n", cl.Partition, cl.Epoch, errors.Is(err, partition.ErrFenced), strings.ReplaceAll(fmt.Sprint(err), " ", "_"))
	}))
	c, err := newConsumer(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	partition.SetBeforeFence(c, func(cl partition.Claim, msgs []kafka.Message) { pausePoint("fence", cl, msgs) })
	if unfenced {
		partition.SetUnfenced(c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.Run(ctx, cfg.handler); err != nil {
		t.Fatal(err)
	}
}

// childLines collects a child's output lines as they come, so a test can
// wait for a set of them without losing the others.
type childLines struct {
	c    *testenv.Child
	mu   sync.Mutex
	all  []string
	done chan struct{}
}

func collectLines(c *testenv.Child) *childLines {
	l := &childLines{c: c, done: make(chan struct{})}
	exited := make(chan struct{})
	go func() { _ = c.Wait(); close(exited) }()
	go func() {
		defer close(l.done)
		for {
			line, ok := c.TryLine()
			if ok {
				l.mu.Lock()
				l.all = append(l.all, line)
				l.mu.Unlock()
				continue
			}
			select {
			case <-exited:
				for line, ok := c.TryLine(); ok; line, ok = c.TryLine() {
					l.mu.Lock()
					l.all = append(l.all, line)
					l.mu.Unlock()
				}
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return l
}

// stop kills the child and waits until its lines are collected.
func (l *childLines) stop() {
	l.c.Kill()
	<-l.done
}

// await waits for n lines starting with word (see awaitMatching).
func (l *childLines) await(n int, word string, timeout time.Duration) ([]map[string]string, error) {
	return l.awaitMatching(n, word, timeout, func(map[string]string) bool { return true })
}

// awaitMatching waits, for at most timeout (scaled), until the child has
// printed n lines that start with word and whose key=value fields match,
// and returns their fields, in order.
func (l *childLines) awaitMatching(n int, word string, timeout time.Duration, match func(map[string]string) bool) ([]map[string]string, error) {
	timeout = testenv.Scale(timeout)
	deadline := time.Now().Add(timeout)
	for {
		var got []map[string]string
		l.mu.Lock()
		for _, line := range l.all {
			fs := strings.Fields(line)
			if len(fs) == 0 || fs[0] != word {
				continue
			}
			f := map[string]string{}
			for _, kv := range fs[1:] {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			if match(f) {
				got = append(got, f)
			}
		}
		l.mu.Unlock()
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-l.done:
			return got, fmt.Errorf("the child exited after %d of %d %q lines", len(got), n, word)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return got, fmt.Errorf("the child printed %d of %d %q lines within %v", len(got), n, word, timeout)
		}
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
