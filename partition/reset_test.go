package partition_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/partition"
)

// Deleting the group restarts Kafka's generation at 1. The stored epochs
// go on rising, the new life's owners take over from the stored offsets,
// a delayed claim from the old life is refused even though its generation
// number is higher than the new owner's, and every offset still lands
// once, in order.
func TestGroupReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const parts = 2
	b := newBed(t, parts)
	var mu sync.Mutex
	var claims []partition.Claim
	cfg := func(name string) spec {
		c := b.config(name, nil)
		c.with(partition.WithOnClaim(func(cl partition.Claim) { mu.Lock(); claims = append(claims, cl); mu.Unlock() }))
		return c
	}
	claimed := func() []partition.Claim {
		mu.Lock()
		defer mu.Unlock()
		return append([]partition.Claim(nil), claims...)
	}

	// The first life: m1, then m2 joins (generation 2 at least), then m1 leaves.
	produce(t, b.brokers, b.topic, parts, 0, 40)
	m1 := startMember(t, b.pool, cfg("m1"))
	if err := waitRows(ctx, b.pool, 40); err != nil {
		t.Fatal(err)
	}
	m2 := startMember(t, b.pool, cfg("m2"))
	produce(t, b.brokers, b.topic, parts, 40, 20)
	if err := waitRows(ctx, b.pool, 120); err != nil {
		t.Fatal(err)
	}
	if err := m1.stop(); err != nil {
		t.Fatal(err)
	}
	produce(t, b.brokers, b.topic, parts, 60, 20) // only m2 is left to apply these
	if err := waitRows(ctx, b.pool, 160); err != nil {
		t.Fatal(err)
	}
	if err := m2.stop(); err != nil {
		t.Fatal(err)
	}
	oldLife := claimed()
	old := oldLife[len(oldLife)-1]
	if old.Generation < 2 {
		t.Fatalf("the first life ended at generation %d; the test needs one above 1", old.Generation)
	}
	var before [parts]int64
	for p := range before {
		r, err := readRow(ctx, b.pool, b.group, b.topic, p)
		if err != nil {
			t.Fatal(err)
		}
		before[p] = r.epoch
	}

	deleteGroup(t, b.brokers, b.group)

	// The second life.
	m3 := startMember(t, b.pool, cfg("m3"))
	produce(t, b.brokers, b.topic, parts, 80, 20)
	if err := waitRows(ctx, b.pool, 200); err != nil {
		t.Fatal(err)
	}
	newLife := claimed()[len(oldLife):]
	if len(newLife) < parts {
		t.Fatalf("after the reset: claims %+v, want one per partition", newLife)
	}
	for _, cl := range newLife[:parts] {
		if cl.Generation != 1 {
			t.Errorf("first claim after the reset in generation %d, want 1 (Kafka restarted it)", cl.Generation)
		}
		if cl.Epoch <= before[cl.Partition] {
			t.Errorf("partition %d: epoch %d after the reset, not above %d", cl.Partition, cl.Epoch, before[cl.Partition])
		}
	}

	// A claim from the old life, delayed until now: its generation is
	// higher than the stored one, so a generation comparison would grant
	// it. The coordinator does not know its member: refused, nothing moves.
	stored, err := readRow(ctx, b.pool, b.group, b.topic, old.Partition)
	if err != nil {
		t.Fatal(err)
	}
	if old.Generation <= stored.generation {
		t.Fatalf("old generation %d not above the new life's %d: the test shows nothing", old.Generation, stored.generation)
	}
	if _, err := partition.ClaimAs(ctx, m3.c, b.topic, old.Partition, old.Generation, old.MemberID); !errors.Is(err, partition.ErrFenced) {
		t.Fatalf("delayed claim from the old life (generation %d > stored %d): %v, want ErrFenced", old.Generation, stored.generation, err)
	}
	after, err := readRow(ctx, b.pool, b.group, b.topic, old.Partition)
	if err != nil {
		t.Fatal(err)
	}
	if after.epoch != stored.epoch || after.member != stored.member {
		t.Fatalf("the refused claim moved the row from %+v to %+v", stored, after)
	}

	produce(t, b.brokers, b.topic, parts, 100, 20)
	if err := waitRows(ctx, b.pool, 240); err != nil {
		t.Fatal(err)
	}
	if err := m3.stop(); err != nil {
		t.Fatal(err)
	}
	tl, err := count(ctx, b.pool, parts, 120)
	if err != nil {
		t.Fatal(err)
	}
	var epochDown int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE epoch < prev) FROM
		(SELECT epoch, lag(epoch) OVER (PARTITION BY partition_id ORDER BY seq) AS prev FROM results) x`).Scan(&epochDown); err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || tl.rows != 240 || epochDown != 0 {
		t.Fatalf("results %v, %d epochs going down; want 240 rows, exact, epochs rising", tl, epochDown)
	}
	t.Logf("old life ended at generation %d (epochs %v); new life generation 1 claimed epochs above them; stale claim refused", old.Generation, before)
}

// deleteGroup deletes an empty group, retrying while the coordinator
// still sees members leaving.
func deleteGroup(t testing.TB, brokers []string, group string) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr, Timeout: 10 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := client.DeleteGroups(context.Background(), &kafka.DeleteGroupsRequest{GroupIDs: []string{group}})
		if err == nil {
			err = res.Errors[group]
		}
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("delete group %s: %v", group, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
