package partition_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nolock/nolock/partition"
)

// Claims on the real broker: a claim wins only for the member the
// coordinator assigns the partition to, right when the claim holds the
// row. Refused claims leave the epoch alone; a granted one raises it by
// one and fences every older worker, even one of the same member.
func TestClaimOrdering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBed(t, 1)
	produce(t, b.brokers, b.topic, 1, 0, 30)
	var mu sync.Mutex
	var claims []partition.Claim
	var releases []error
	cfg := b.config("m", nil)
	cfg.with(partition.WithOnClaim(func(cl partition.Claim) { mu.Lock(); claims = append(claims, cl); mu.Unlock() }))
	cfg.with(partition.WithOnRelease(func(_ partition.Claim, err error) { mu.Lock(); releases = append(releases, err); mu.Unlock() }))
	m := startMember(t, b.pool, cfg)
	if err := waitRows(ctx, b.pool, 30); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	first := claims[0]
	mu.Unlock()
	epoch := func() int64 {
		r, err := readRow(ctx, b.pool, b.group, b.topic, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r.epoch
	}
	before := epoch()

	for _, tc := range []struct {
		name       string
		partition  int
		generation int32
		member     string
	}{
		{"a member the group does not know", 0, first.Generation, "zombie-of-another-life"},
		{"the owner, from an older generation", 0, first.Generation - 1, first.MemberID},
		{"the owner, for a partition it is not assigned", 7, first.Generation, first.MemberID},
	} {
		if _, err := partition.ClaimAs(ctx, m.c, b.topic, tc.partition, tc.generation, tc.member); !errors.Is(err, partition.ErrFenced) {
			t.Errorf("claim by %s: %v, want ErrFenced", tc.name, err)
		}
	}
	if got := epoch(); got != before {
		t.Fatalf("refused claims moved the epoch from %d to %d", before, got)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+partition.DefaultTable+` WHERE partition_id = 7`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("a refused claim left a row (%d, %v)", n, err)
	}

	// The rightful member claims again (as a second worker of its own
	// would): granted, one above, and the running worker is fenced.
	cl, err := partition.ClaimAs(ctx, m.c, b.topic, 0, first.Generation, first.MemberID)
	if err != nil {
		t.Fatalf("claim by the assignee: %v", err)
	}
	if cl.Epoch != before+1 {
		t.Fatalf("granted claim has epoch %d, want %d", cl.Epoch, before+1)
	}
	produce(t, b.brokers, b.topic, 1, 30, 30)
	if err := waitRows(ctx, b.pool, 60); err != nil {
		t.Fatal(err)
	}
	if err := m.stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	fenced := 0
	for _, err := range releases {
		if errors.Is(err, partition.ErrFenced) {
			fenced++
		}
	}
	if fenced != 1 {
		t.Fatalf("releases %v: want exactly one ErrFenced (the worker whose claim was taken over)", releases)
	}
	if last := claims[len(claims)-1]; last.Epoch != before+2 || last.Offset < 30 {
		t.Fatalf("the member's next claim: %+v; want epoch %d from offset >= 30", last, before+2)
	}
	tl, err := count(ctx, b.pool, 1, 60)
	if err != nil {
		t.Fatal(err)
	}
	if !tl.exact() || tl.rows != 60 {
		t.Fatalf("results: %v; want 60 rows, each offset once, in order", tl)
	}
	t.Logf("claims %d, fenced releases %d, final epoch %d", len(claims), fenced, epoch())
}
