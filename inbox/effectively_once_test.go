package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/inbox"
	"github.com/nolock/nolock/internal/testenv"
)

// The effectively-once proof on the real broker: consumer processes are
// SIGKILLed in the middle of their work and replaced, and at the end every
// message's effect is applied exactly once: none lost, none doubled, also
// for the messages a producer sent twice (same id, another offset).
//
// Two ways of consuming, at once:
//
//   - group: a consumer group of two member processes over four
//     partitions; each kill and each replacement rebalances the group, so
//     partitions move between live members while batches are in flight.
//   - lanes: each partition of another topic is a lane, consumed by one
//     process at a time with a manual assignment (no group membership, so
//     a replacement starts at once): it resumes at the offset committed
//     for the lane and commits offsets there. Lanes run side by side, and
//     each kills its consumer many times.
//
// A consumer is killed at a point it announces after a random number of
// messages: inside a handler, with its batch's transaction open and part
// of the batch written ("in-transaction", in the group and in turn in the
// lanes); after its batch committed and before the batch's Kafka offsets
// are committed, so the replacement gets the batch again
// ("before-offset-commit", lanes); or at a random moment after it handled
// its first message, which the parent picks (lanes). The stress mode kills
// 125 times in each of 8 lanes.
func TestEffectivelyOnceWithKills(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t, 8)
	newInbox(t, pool)
	dsn := testenv.PostgresDSNFor(t, schema)
	// Each kill in the group stalls the group until the coordinator drops
	// the dead member (its session timeout): two kills there.
	const groupKills = 2
	lanes, killsPerLane := testenv.Trials(2, 8), testenv.Trials(4, 125)
	perLane := 40*killsPerLane + 100 // a consumer applies at most about 40 before its kill

	groupBrokers, groupTopic := testenv.Topic(t, 4)
	groupIDs := producePayments(t, groupBrokers, groupTopic, 4, "pay-", 100)
	laneBrokers, laneTopic := testenv.Topic(t, lanes)
	laneIDs := producePayments(t, laneBrokers, laneTopic, lanes, "lane", perLane)

	var mu sync.Mutex
	var kills killCounts
	var errs []error
	var wg sync.WaitGroup
	run := func(f func() (killCounts, error)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := f()
			mu.Lock()
			defer mu.Unlock()
			kills.add(k)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	run(func() (killCounts, error) { return killGroup(t, pool, dsn, groupTopic, groupKills) })
	for lane := range lanes {
		run(func() (killCounts, error) {
			return killLane(t, pool, dsn, laneTopic, lane, laneIDs[lane], killsPerLane)
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}

	got := effects(t, pool)
	messages, dups, lost, doubled := 0, 0, 0, 0
	for _, ids := range append(groupIDs, laneIDs...) {
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				dups++
				continue
			}
			seen[id] = true
			messages++
			switch n := got[id]; {
			case n == 0:
				lost++
			case n > 1:
				doubled += n - 1
			}
		}
	}
	testenv.Figures(t, "inbox SIGKILL", "%d kills, %d messages, %d lost, %d doubled (kills: %d inside a transaction, %d between the commit and the offset commit, %d at random moments; %d messages also sent a second time)",
		kills.total(), messages, lost, doubled, kills.inTransaction, kills.beforeOffsetCommit, kills.random, dups)
	if lost != 0 || doubled != 0 || len(got) != messages {
		t.Errorf("%d messages: %d lost, %d applied more than once, %d distinct effects", messages, lost, doubled, len(got))
	}
	if want := groupKills + lanes*killsPerLane*3/4; kills.total() < want {
		t.Errorf("%d kills, want at least %d", kills.total(), want)
	}
}

// killCounts counts kills by the point where they landed.
type killCounts struct{ inTransaction, beforeOffsetCommit, random int }

func (k *killCounts) add(o killCounts) {
	k.inTransaction += o.inTransaction
	k.beforeOffsetCommit += o.beforeOffsetCommit
	k.random += o.random
}

func (k killCounts) total() int { return k.inTransaction + k.beforeOffsetCommit + k.random }

// producePayments writes n payments with ids prefix<p>-<i> to each
// partition p of topic, plus one in ten of them a second time at a later
// offset of the same partition (a producer that retried). It returns the
// ids sent to each partition, in order, duplicates included.
func producePayments(t *testing.T, brokers []string, topic string, partitions int, prefix string, n int) [][]string {
	t.Helper()
	ids := make([][]string, partitions)
	var msgs []kafka.Message
	for p := range partitions {
		for i := range n {
			ids[p] = append(ids[p], fmt.Sprintf("%s%d-%d", prefix, p, i))
		}
		for range n / 10 {
			ids[p] = append(ids[p], ids[p][rand.IntN(n)])
		}
		for _, id := range ids[p] {
			msgs = append(msgs, kafka.Message{Key: []byte(strconv.Itoa(p)), Value: []byte("v-" + id), Headers: []kafka.Header{{Key: "id", Value: []byte(id)}}})
		}
	}
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, Transport: tr, BatchSize: 1000, BatchTimeout: 5 * time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { p, _ := strconv.Atoi(string(m.Key)); return p })}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return ids
}

// killGroup runs the group part: member processes killed inside a
// transaction and replaced, kills times in all, two members at a time;
// then the members that remain apply the rest.
func killGroup(t *testing.T, pool *pgxpool.Pool, dsn, topic string, kills int) (killCounts, error) {
	var kc killCounts
	env := []string{"INBOX_DSN=" + dsn, "INBOX_TOPIC=" + topic, "INBOX_GROUP=" + testenv.Name("g")}
	withKillPoint := kills
	start := func() *testenv.Child {
		e := env
		if withKillPoint > 0 {
			withKillPoint--
			e = append(e[:len(e):len(e)], "INBOX_KILL_AT=in-transaction", "INBOX_AFTER="+strconv.Itoa(1+rand.IntN(30)))
		}
		return testenv.StartChild(t, "TestChildConsumer", e...)
	}
	members := []*testenv.Child{start(), start()}
	deadline := time.Now().Add(testenv.Scale(2 * time.Minute))
	for kc.inTransaction < kills {
		for i, m := range members {
			if line, ok := m.TryLine(); ok && strings.HasPrefix(line, "in-transaction") {
				m.Kill()
				_ = m.Wait()
				kc.inTransaction++
				members[i] = start() // a replacement joins: another rebalance
			}
		}
		if time.Now().After(deadline) {
			return kc, fmt.Errorf("group: %d of %d kills within %v", kc.inTransaction, kills, testenv.Scale(2*time.Minute))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return kc, waitApplied(pool, "pay-", 4*100)
}

// killLane runs one lane: consumers of partition lane of topic, one at a
// time, each killed at its kill point and replaced, kills times; then a
// last one applies the rest. ids are the lane's ids, duplicates included.
func killLane(t *testing.T, pool *pgxpool.Pool, dsn, topic string, lane int, ids []string, kills int) (killCounts, error) {
	var kc killCounts
	prefix := fmt.Sprintf("lane%d-", lane)
	distinct := map[string]bool{}
	for _, id := range ids {
		distinct[id] = true
	}
	env := []string{"INBOX_DSN=" + dsn, "INBOX_TOPIC=" + topic, "INBOX_GROUP=" + testenv.Name("g"), "INBOX_PARTITION=" + strconv.Itoa(lane)}
	for k := range kills {
		// Every consumer must reach its kill point: stop killing when the
		// lane is nearly done.
		var applied int
		if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT id) FROM effects WHERE starts_with(id, $1)`, prefix).Scan(&applied); err != nil {
			return kc, err
		}
		if applied > len(distinct)-60 {
			break
		}
		point := [...]string{"in-transaction", "before-offset-commit", "random"}[k%3]
		e := append(env[:len(env):len(env)], "INBOX_KILL_AT="+point, "INBOX_AFTER="+strconv.Itoa(1+rand.IntN(25)))
		c := testenv.StartChild(t, "TestChildConsumer", e...)
		announce := point
		if point == "random" {
			announce = "handled"
		}
		if err := awaitLine(c, announce, time.Minute); err != nil {
			c.Kill()
			return kc, fmt.Errorf("lane %d, kill %d: %w", lane, k, err)
		}
		switch point {
		case "in-transaction":
			kc.inTransaction++
		case "before-offset-commit":
			kc.beforeOffsetCommit++
		default:
			kc.random++
			time.Sleep(time.Duration(rand.IntN(100)) * time.Millisecond) // the fault: a kill at a moment the child does not choose
		}
		c.Kill()
		_ = c.Wait()
	}
	c := testenv.StartChild(t, "TestChildConsumer", env...)
	defer c.Kill()
	if err := waitApplied(pool, prefix, len(distinct)); err != nil {
		return kc, fmt.Errorf("lane %d: %w", lane, err)
	}
	return kc, nil
}

// waitApplied waits until the effects of n distinct ids starting with
// prefix are applied (testenv.Poll: it may run on any goroutine).
func waitApplied(pool *pgxpool.Pool, prefix string, n int) error {
	return testenv.Poll(fmt.Sprintf("%d messages %s… applied", n, prefix), func() (bool, error) {
		var got int
		err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT id) FROM effects WHERE starts_with(id, $1)`, prefix).Scan(&got)
		return got >= n, err
	})
}

// awaitLine waits for a line of the child's that starts with word, for at
// most timeout (scaled). Unlike Child.WaitFor it does not fail the test,
// so it may run on any goroutine.
func awaitLine(c *testenv.Child, word string, timeout time.Duration) error {
	timeout = testenv.Scale(timeout)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		line, ok := c.TryLine()
		if !ok {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if strings.HasPrefix(line, word) {
			return nil
		}
	}
	return fmt.Errorf("the child did not print %q within %v", word, timeout)
}

// TestChildConsumer is a consumer process for TestEffectivelyOnceWithKills:
// it runs the inbox on INBOX_TOPIC until it is killed, as a member of the
// group INBOX_GROUP or, with INBOX_PARTITION set, on that partition alone
// (see assignedReader). It prints "handled" when its handler first runs.
// INBOX_KILL_AT names where it waits to be killed once its handler ran
// INBOX_AFTER times: "in-transaction" (inside the handler, printing
// "in-transaction <id>"), "before-offset-commit" (after its batch
// committed, before its Kafka offsets are committed, printing
// "before-offset-commit"); anything else, nowhere.
func TestChildConsumer(t *testing.T) {
	testenv.ChildOnly(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("INBOX_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	brokers, topic, group := testenv.Kafka(t), os.Getenv("INBOX_TOPIC"), os.Getenv("INBOX_GROUP")
	in, err := inbox.New(pool, "billing", inbox.WithMaxBatch(10), inbox.WithBatchWait(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var r inbox.Reader
	if p := os.Getenv("INBOX_PARTITION"); p != "" {
		n, _ := strconv.Atoi(p)
		ar, err := newAssignedReader(ctx, brokers, topic, group, n)
		if err != nil {
			t.Fatal(err)
		}
		r = ar
	} else {
		r = groupReader(brokers, topic, group)
	}
	killAt := os.Getenv("INBOX_KILL_AT")
	after, _ := strconv.ParseInt(os.Getenv("INBOX_AFTER"), 10, 64)
	var handled atomic.Int64
	if killAt == "before-offset-commit" {
		r = holdOffsetCommit{r, func() bool { return handled.Load() >= after }}
	}
	err = in.Run(ctx, r, func(ctx context.Context, tx pgx.Tx, m kafka.Message) error {
		n := handled.Add(1)
		if n == 1 {
			fmt.Println("handled")
		}
		if killAt == "in-transaction" && n == after {
			fmt.Println("in-transaction", string(m.Value))
			time.Sleep(time.Hour) // the parent kills us here, our batch's transaction open
		}
		time.Sleep(time.Millisecond) // work: a kill at a random moment lands in a batch
		return record(ctx, tx, m)
	})
	t.Fatalf("Run returned: %v", err)
}

// holdOffsetCommit waits to be killed in the offset commit that follows a
// committed batch, once ready.
type holdOffsetCommit struct {
	inbox.Reader
	ready func() bool
}

func (h holdOffsetCommit) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	if h.ready() {
		fmt.Println("before-offset-commit")
		time.Sleep(time.Hour) // the parent kills us here, the batch committed and its offsets not
	}
	return h.Reader.CommitMessages(ctx, msgs...)
}

// assignedReader consumes one partition with a manual assignment, as a
// standalone consumer does: no group membership (so starting one costs no
// rebalance), starting at the offset committed for the group, and
// committing offsets there (generation -1).
type assignedReader struct {
	*kafka.Reader
	client       *kafka.Client
	group, topic string
	partition    int
}

func newAssignedReader(ctx context.Context, brokers []string, topic, group string, partition int) (*assignedReader, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: &kafka.Transport{}, Timeout: 10 * time.Second}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {partition}}})
	if err != nil {
		return nil, fmt.Errorf("offset fetch: %w", err)
	}
	start := kafka.FirstOffset
	for _, p := range res.Topics[topic] {
		if p.Partition == partition && p.CommittedOffset >= 0 {
			start = p.CommittedOffset
		}
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond})
	if err := r.SetOffset(start); err != nil {
		return nil, err
	}
	return &assignedReader{Reader: r, client: client, group: group, topic: topic, partition: partition}, nil
}

// CommitMessages commits the offset after the last of msgs.
func (r *assignedReader) CommitMessages(ctx context.Context, msgs ...kafka.Message) error {
	next := msgs[len(msgs)-1].Offset + 1
	res, err := r.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: r.group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{r.topic: {{Partition: r.partition, Offset: next}}}})
	if err != nil {
		return err
	}
	for _, p := range res.Topics[r.topic] {
		if p.Error != nil {
			return p.Error
		}
	}
	return nil
}
