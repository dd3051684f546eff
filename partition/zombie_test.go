package partition_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// The zombie scenario, on the real broker, with a real process:
//
//  1. Member A (a child process) owns the topic's only partition and
//     applies it from offset 0.
//  2. At its first batch from offset zombieAt on, A is frozen with SIGSTOP,
//     either before the batch's transaction (pause "fence": it holds the
//     messages but has not written) or inside the handler (pause
//     "handler": its transaction is open, fence passed, rows inserted, the
//     partition's row locked).
//  3. Member B (this process) joins. The coordinator drops A, B claims the
//     partition and applies everything from where A's committed batches
//     end. A stays frozen past the session timeout.
//  4. A resumes and goes on with its batch: it tries to write and commit.
//
// With the fence, A's write is rejected and results holds every offset
// exactly once, in order. Pause "fence": A's transaction begins after B's
// claim and its fence refuses it (ErrFenced). Pause "handler": A's open
// transaction holds the partition's row lock, so B's claim waits until
// PostgreSQL ends A's session (idle_in_transaction_session_timeout =
// BatchTimeout); A's commit then fails, and its retry, if its generation
// has not ended first, is fenced. Either way no row of A's from the paused
// batch on commits.
//
// Without the fence (TestZombieWithoutFence, pause "fence", where the fence
// is the only guard) the same run applies A's batch a second time, out of
// order: the count below catches it, so this test can fail.

const (
	zombieMessages = 200
	zombieAt       = 50
)

// Fenced: every trial must end exact, with A fenced.
func TestZombie(t *testing.T) {
	t.Parallel()
	n := trials(3, 100)
	results := runZombies(t, n, []string{"fence", "handler"}, false)
	fenced, cutOff := 0, 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("trial %d (pause in %s): %v", i, r.pauseIn, r.err)
			continue
		}
		if !r.tally.exact() || r.tally.rows != zombieMessages {
			t.Errorf("trial %d (pause in %s): results %v; want %d rows, each offset once, in order", i, r.pauseIn, r.tally, zombieMessages)
		}
		if r.zombieRows != 0 {
			t.Errorf("trial %d (pause in %s): %d rows of the zombie's from offset %d on committed", i, r.pauseIn, r.zombieRows, r.pauseOffset)
		}
		switch {
		case r.zombieFenced:
			fenced++
		case r.pauseIn == "fence":
			t.Errorf("trial %d (pause in fence): the resumed member was not fenced: %s", i, r.zombieRelease)
		default:
			cutOff++ // its commit failed, and its generation ended before a retry
		}
		if r.epochB <= r.epochA {
			t.Errorf("trial %d: B claimed epoch %d, not above A's %d", i, r.epochB, r.epochA)
		}
		if r.paused < testSession {
			t.Errorf("trial %d: A was paused %v, not past the session timeout %v", i, r.paused, testSession)
		}
	}
	t.Logf("%d trials: zombie's write rejected in all (%d by ErrFenced, %d by its lost session with no retry); every trial %d offsets once, in order",
		n, fenced, cutOff, zombieMessages)
}

// Unfenced: the same scenario with A's fence switched off must be caught
// doubling or reordering offsets, or the zombie test proves nothing.
func TestZombieWithoutFence(t *testing.T) {
	t.Parallel()
	n := trials(2, 10)
	results := runZombies(t, n, []string{"fence"}, true)
	caught := 0
	for i, r := range results {
		if r.err != nil {
			t.Errorf("trial %d (pause in %s): %v", i, r.pauseIn, r.err)
			continue
		}
		if r.tally.exact() {
			t.Errorf("trial %d (pause in %s): without the fence the zombie's write went unnoticed: %v", i, r.pauseIn, r.tally)
		} else {
			caught++
		}
		t.Logf("trial %d (pause in %s), no fence: %v", i, r.pauseIn, r.tally)
	}
	t.Logf("%d unfenced trials: %d caught applying offsets twice or out of order", n, caught)
}

// zombieResult is what one trial saw.
type zombieResult struct {
	pauseIn        string
	pauseOffset    int64
	zombieRows     int // A's rows from pauseOffset on
	tally          tally
	zombieFenced   bool
	zombieRelease  string
	epochA, epochB int64
	paused         time.Duration
	err            error
}

// runZombies runs n trials, up to 10 at a time, cycling through the pause
// points. Setup that can fail the test runs on the test's goroutine; the
// trials report through their results.
func runZombies(t *testing.T, n int, pauses []string, unfenced bool) []zombieResult {
	results := make([]zombieResult, n)
	const wave = 10
	for start := 0; start < n; start += wave {
		var wg sync.WaitGroup
		for i := start; i < min(n, start+wave); i++ {
			pauseIn := pauses[i%len(pauses)]
			b := newBed(t, 1)
			produce(t, b.brokers, b.topic, 1, 0, zombieMessages)
			env := []string{"ZOMBIE_SCHEMA=" + b.schema, "ZOMBIE_TOPIC=" + b.topic, "ZOMBIE_GROUP=" + b.group, "ZOMBIE_PAUSE_IN=" + pauseIn}
			if unfenced {
				env = append(env, "ZOMBIE_UNFENCED=1")
			}
			a := testenv.StartChild(t, "TestChildZombie", env...)
			var epochB int64
			cfg := b.config("B", nil)
			cfg.OnClaim = func(cl partition.Claim) {
				if epochB == 0 {
					epochB = cl.Epoch
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := zombieTrial(t, b, a, cfg, pauseIn)
				r.epochB = epochB // read after B stopped
				results[i] = r
			}()
		}
		wg.Wait()
	}
	return results
}

// zombieTrial runs steps 2-4 of one trial and counts the results.
func zombieTrial(t *testing.T, b *bed, a *testenv.Child, cfg partition.Config, pauseIn string) zombieResult {
	r := zombieResult{pauseIn: pauseIn}
	ctx := context.Background()
	line, err := waitLine(a, "claimed ", 60*time.Second)
	if err != nil {
		r.err = err
		return r
	}
	r.epochA, _ = strconv.ParseInt(strings.Fields(line)[1], 10, 64)
	line, err = waitLine(a, "pause-point", 60*time.Second)
	if err != nil {
		r.err = err
		return r
	}
	r.pauseOffset, _ = strconv.ParseInt(strings.Fields(line)[1], 10, 64)
	a.Pause()
	pausedAt := time.Now()

	bm := startMember(t, b.pool, cfg)
	r.err = waitRows(ctx, b.pool, zombieMessages, 60*time.Second)
	if r.err == nil {
		time.Sleep(time.Until(pausedAt.Add(testSession + 500*time.Millisecond)))
	}
	r.paused = time.Since(pausedAt)
	a.Resume()
	if r.err == nil {
		r.zombieRelease, r.err = waitLine(a, "released", 60*time.Second)
		r.zombieFenced = strings.Contains(r.zombieRelease, "fenced=true")
	}
	// Give an unfenced zombie's writes time to land before counting.
	time.Sleep(500 * time.Millisecond)
	if err := bm.stop(); err != nil && r.err == nil {
		r.err = fmt.Errorf("B's Run: %w", err)
	}
	a.Kill()
	tl, err := count(ctx, b.pool, 1, zombieMessages)
	if err != nil && r.err == nil {
		r.err = err
	}
	r.tally = tl
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE member = 'A' AND msg_offset >= $1`, r.pauseOffset).Scan(&r.zombieRows); err != nil && r.err == nil {
		r.err = err
	}
	return r
}

// waitLine waits for a line of the child's containing s, without failing
// the test (it runs off the test's goroutine).
func waitLine(c *testenv.Child, s string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		line, ok := c.TryLine()
		if !ok {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if strings.Contains(line, s) {
			return line, nil
		}
	}
	return "", fmt.Errorf("child did not print %q within %v", s, timeout)
}

// TestChildZombie is member A's process (see TestZombie). It prints
// "claimed <epoch>", "pause-point <offset>" (then sleeps, so the parent
// can freeze it there) and "released fenced=<bool> …".
func TestChildZombie(t *testing.T) {
	testenv.ChildOnly(t)
	schema, pauseIn := os.Getenv("ZOMBIE_SCHEMA"), os.Getenv("ZOMBIE_PAUSE_IN")
	pool := testenv.Pool(t, testenv.PostgresDSNFor(t, schema), 4)
	b := &bed{brokers: testenv.Kafka(t), topic: os.Getenv("ZOMBIE_TOPIC"), group: os.Getenv("ZOMBIE_GROUP"), schema: schema, pool: pool}

	var once sync.Once
	pausePoint := func(msgs []kafka.Message) {
		if msgs[0].Offset < zombieAt {
			return
		}
		once.Do(func() {
			fmt.Println("pause-point", msgs[0].Offset)
			time.Sleep(3 * time.Second) // the parent freezes us in here
		})
	}
	rec := record("A")
	cfg := b.config("A", func(ctx context.Context, tx pgx.Tx, msgs []kafka.Message) error {
		if err := rec(ctx, tx, msgs); err != nil {
			return err
		}
		if pauseIn == "handler" {
			pausePoint(msgs)
		}
		return nil
	})
	cfg.OnClaim = func(cl partition.Claim) { fmt.Println("claimed", cl.Epoch, cl.Generation) }
	cfg.OnRelease = func(cl partition.Claim, err error) {
		fmt.Printf("released fenced=%v epoch=%d err=%v\n", errors.Is(err, partition.ErrFenced), cl.Epoch, err)
	}
	c, err := partition.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if pauseIn == "fence" {
		partition.SetBeforeFence(c, func(_ partition.Claim, msgs []kafka.Message) { pausePoint(msgs) })
	}
	if os.Getenv("ZOMBIE_UNFENCED") != "" {
		partition.SetUnfenced(c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
