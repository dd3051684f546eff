package partition_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/partition"
)

// A network that holds one owner's packets past its ownership, then
// delivers them. One round runs one trial per partition of a fresh topic:
//
//  1. Member A owns every partition; its Kafka traffic (group, fetches,
//     DescribeGroups) goes through a proxy, and with fault "postgres" its
//     PostgreSQL traffic too. Each of A's workers waits before the
//     transaction of its first batch from offset zombieAt on.
//  2. The proxies shut: A's heartbeats and everything else it sends are
//     held. With fault "postgres" A's workers then go on: their batch
//     transactions (BEGIN, then the fence) sit in the network.
//  3. The coordinator drops A when its session expires; B (direct links)
//     joins, claims every partition with a higher epoch and applies it.
//  4. Fault "postgres": the PostgreSQL proxy opens and delivers A's held
//     transactions, late. Fault "kafka": A's workers, still cut off from
//     Kafka, go on with the batches they hold (a batch in flight outlives
//     its generation). Either way
//     A's late writes reach PostgreSQL after B's claims, and the epoch
//     fence must refuse every one (ErrFenced): nothing of A's from the held
//     batch on commits, and every offset is applied once, in order.
//
// With A's fence switched off the same round must be caught applying
// offsets twice, so the test can fail.
//
// The stress mode runs 4 rounds of 50 partitions per fault.
func TestLateWriteAfterNetworkFault(t *testing.T) {
	t.Parallel()
	faults := []string{"postgres", "kafka"}
	rounds, parts := testenv.Trials(1, 4), testenv.Trials(3, 50)
	results := map[string][]lateResult{}
	for i := range rounds {
		// A subtest per round, so each round's pools, topics and schemas
		// are released before the next. Its scenarios run at once: each
		// mostly waits for a session to expire.
		t.Run(fmt.Sprint("round_", i), func(t *testing.T) {
			var rs []*lateRound
			for _, fault := range faults {
				rs = append(rs, newLateRound(t, fault, parts, false))
				if i == 0 {
					rs = append(rs, newLateRound(t, fault, 1, true))
				}
			}
			var wg sync.WaitGroup
			for _, r := range rs {
				wg.Add(1)
				go func() { defer wg.Done(); r.run() }()
			}
			wg.Wait()
			for _, r := range rs {
				name := r.fault
				if r.unfenced {
					name += ", no fence"
				}
				if r.err != nil {
					t.Errorf("%s: %v", name, r.err)
					continue
				}
				results[name] = append(results[name], r.results...)
			}
		})
	}
	for _, fault := range faults {
		var n, late, fenced, inexact int
		for _, r := range results[fault] {
			n++
			if !r.tally.exact() || r.tally.rows != zombiePerPartition {
				inexact++
				t.Errorf("%s, partition %d: results %v; want %d rows, each offset once, in order", fault, r.partition, r.tally, zombiePerPartition)
			}
			if r.lateRows != 0 {
				late++
				t.Errorf("%s, partition %d: %d rows of A's late batch (offset %d on) committed", fault, r.partition, r.lateRows, r.heldOffset)
			}
			if errors.Is(r.release, partition.ErrFenced) {
				fenced++
			} else {
				t.Errorf("%s, partition %d: A's late batch ended with %v, want ErrFenced", fault, r.partition, r.release)
			}
			if r.epochB <= r.epochA {
				t.Errorf("%s, partition %d: B claimed epoch %d, not above A's %d", fault, r.partition, r.epochB, r.epochA)
			}
		}
		testenv.Figures(t, "partition late write, "+fault+" link held", "%d trials, %d late writes accepted, %d refused by the epoch fence, %d partitions not exact",
			n, late, fenced, inexact)
		unfenced := results[fault+", no fence"]
		for _, r := range unfenced {
			if r.tally.exact() {
				t.Errorf("%s, no fence: A's late write went unnoticed: %v", fault, r.tally)
			}
		}
		t.Logf("%s, no fence: %d trials, each must be caught applying offsets twice or out of order", fault, len(unfenced))
	}
}

// lateResult is what one trial (one partition of a round) saw.
type lateResult struct {
	partition      int
	heldOffset     int64 // the first offset of A's held batch
	lateRows       int   // A's rows from heldOffset on
	release        error // how A's held worker ended
	epochA, epochB int64 // A's claim, B's first claim
	tally          tally
}

// lateRound is one round of TestLateWriteAfterNetworkFault for one fault,
// over parts partitions: its world, members A and B, and the gates on A's
// links.
type lateRound struct {
	t                 *testing.T
	fault             string
	unfenced          bool
	parts             int
	b                 *bed
	a, bc             *partition.Consumer
	kafkaGate, pgGate *testenv.Gate
	goOn              chan struct{} // closed: A's workers go on with their held batches
	goOnce            sync.Once

	mu       sync.Mutex
	memberA  string
	heldAt   map[int]lateHeld
	releases map[int]error // how each held worker of A's ended
	epochB   []int64

	results []lateResult
	err     error
}

type lateHeld struct{ epoch, offset int64 }

// newLateRound sets a round up (step 1, but A and B do not run yet), on the
// test's goroutine.
func newLateRound(t *testing.T, fault string, parts int, unfenced bool) *lateRound {
	t.Helper()
	pool, schema := testenv.PostgresSchema(t, 16)
	r := &lateRound{
		t: t, fault: fault, unfenced: unfenced, parts: parts, b: newBedOn(t, parts, pool, schema),
		kafkaGate: testenv.NewGate(), pgGate: testenv.NewGate(), goOn: make(chan struct{}),
		heldAt: map[int]lateHeld{}, releases: map[int]error{}, epochB: make([]int64, parts),
	}
	b := r.b
	produce(t, b.brokers, b.topic, parts, 0, zombiePerPartition)

	dsn, poolSize := testenv.PostgresDSNFor(t, schema), int32(8)
	if fault == "postgres" {
		// A connection per worker, so that every one of A's batch
		// transactions is held in the network.
		dsn, poolSize = testenv.Proxy(t, dsn, r.pgGate.Relay(), r.pgGate.Relay()), int32(parts+2)
	}
	cfg := b.config("A", nil)
	cfg.with(partition.WithDialer(kafkaThrough(t, b.brokers[0], r.kafkaGate)))
	// A's batch transactions wait in the network for as long as it takes
	// the coordinator to drop A and B to take over.
	cfg.with(partition.WithBatchTimeout(testenv.Scale(30*time.Second)), partition.WithRebalanceTimeout(testenv.Scale(40*time.Second)))
	cfg.with(partition.WithOnClaim(func(cl partition.Claim) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.memberA = cl.MemberID
	}))
	cfg.with(partition.WithOnRelease(func(cl partition.Claim, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if h, ok := r.heldAt[cl.Partition]; ok && h.epoch == cl.Epoch {
			r.releases[cl.Partition] = err
		}
	}))
	var err error
	if r.a, err = newConsumer(testenv.Pool(t, dsn, poolSize), cfg); err != nil {
		t.Fatal(err)
	}
	partition.SetBeforeFence(r.a, func(cl partition.Claim, msgs []kafka.Message) {
		if msgs[0].Offset < zombieAt {
			return
		}
		r.mu.Lock()
		_, seen := r.heldAt[cl.Partition]
		if !seen {
			r.heldAt[cl.Partition] = lateHeld{cl.Epoch, msgs[0].Offset}
		}
		r.mu.Unlock()
		if !seen {
			<-r.goOn
		}
	})
	if unfenced {
		partition.SetUnfenced(r.a)
	}

	bcfg := b.config("B", nil)
	bcfg.with(partition.WithOnClaim(func(cl partition.Claim) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.epochB[cl.Partition] == 0 {
			r.epochB[cl.Partition] = cl.Epoch
		}
	}))
	if r.bc, err = newConsumer(pool, bcfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// letGo lets A's workers go on with their held batches.
func (r *lateRound) letGo() { r.goOnce.Do(func() { close(r.goOn) }) }

// locked runs f under the round's lock.
func (r *lateRound) locked(f func() bool) func() (bool, error) {
	return func() (bool, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return f(), nil
	}
}

// run runs the round (A starts, then steps 2-4), on any goroutine,
// leaving r.results or r.err.
func (r *lateRound) run() {
	r.results, r.err = r.steps()
}

func (r *lateRound) steps() ([]lateResult, error) {
	ctx := context.Background()
	b, parts := r.b, r.parts
	am := runMember(r.t, r.a, record("A"))
	defer func() { _ = am.stop() }()
	defer func() { r.letGo(); r.kafkaGate.Open(); r.pgGate.Open() }() // before A stops, also on failure
	if err := testenv.Poll("every worker of A waiting before its batch", r.locked(func() bool { return len(r.heldAt) == parts })); err != nil {
		return nil, err
	}

	// Step 2: the network holds A's traffic.
	r.kafkaGate.Shut()
	if r.fault == "postgres" {
		r.pgGate.Shut()
		r.letGo()
		if err := testenv.Poll("every batch transaction of A's sitting in the network", func() (bool, error) {
			return r.pgGate.Held() >= parts, nil
		}); err != nil {
			return nil, err
		}
	}

	// Step 3: A's session expires, B takes over and applies everything.
	r.mu.Lock()
	a := r.memberA
	r.mu.Unlock()
	if err := testenv.Poll("the coordinator dropping A", func() (bool, error) {
		members, err := groupMembers(ctx, b)
		return err == nil && !slices.Contains(members, a), nil // a failed question is asked again
	}); err != nil {
		return nil, err
	}
	bm := runMember(r.t, r.bc, record("B"))
	defer func() { _ = bm.stop() }()
	if err := waitRows(ctx, b.pool, parts*zombiePerPartition); err != nil {
		return nil, err
	}

	// Step 4: A's late writes reach PostgreSQL.
	if r.fault == "postgres" {
		r.pgGate.Open()
	} else {
		r.letGo()
	}
	if err := testenv.Poll("every held worker of A's ending", r.locked(func() bool { return len(r.releases) == parts })); err != nil {
		return nil, err
	}
	r.kafkaGate.Open()
	if err := am.stop(); err != nil {
		return nil, fmt.Errorf("A's Run: %w", err)
	}
	if err := bm.stop(); err != nil {
		return nil, fmt.Errorf("B's Run: %w", err)
	}
	each, err := countEach(ctx, b.pool, parts, zombiePerPartition)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rs := make([]lateResult, parts)
	for p := range rs {
		h := r.heldAt[p]
		rs[p] = lateResult{partition: p, heldOffset: h.offset, release: r.releases[p], epochA: h.epoch, epochB: r.epochB[p], tally: each[p]}
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM results WHERE member = 'A' AND partition_id = $1 AND msg_offset >= $2`,
			p, h.offset).Scan(&rs[p].lateRows); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// kafkaThrough returns a Dialer whose every connection goes to broker
// through a proxy whose traffic passes gate. The proxy is dialled whatever
// address a client asks for: brokers advertise their own address, so
// redirecting the dial is what keeps every connection on the proxy (one
// broker in the tests).
func kafkaThrough(t testing.TB, broker string, gate *testenv.Gate) *kafka.Dialer {
	t.Helper()
	u, err := url.Parse(testenv.Proxy(t, "tcp://"+broker, gate.Relay(), gate.Relay()))
	if err != nil {
		t.Fatal(err)
	}
	return &kafka.Dialer{
		Timeout: 10 * time.Second,
		DialFunc: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, u.Host)
		},
	}
}

// groupMembers returns the member IDs of b's group, as the coordinator
// sees them.
func groupMembers(ctx context.Context, b *bed) ([]string, error) {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: tr, Timeout: 10 * time.Second}
	res, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{b.group}})
	if err != nil {
		return nil, err
	}
	var members []string
	for _, g := range res.Groups {
		if g.Error != nil {
			return nil, g.Error
		}
		for _, m := range g.Members {
			members = append(members, m.MemberID)
		}
	}
	return members, nil
}
