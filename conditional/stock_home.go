package conditional

import (
	"context"
	"math"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgmode"
)

// A hot key across processes. Each process coalesces its own takes (see
// WithCoalescing), so one process sends one statement at a time per key;
// but N processes on one row are N writers queueing on its lock, and each
// writer added divides every process's statement rate. A home gives each
// process (each Stock) a row of its own: its takes coalesce on its home
// bucket, which no other process writes while the sale runs, so the
// processes' statements run side by side instead of one after another.
//
// A home runs dry before the key does. The batch its home cannot cover is
// then run by steal: one transaction locks every bucket of the key (in
// ascending order, like every multi-row locker here, so there is no
// deadlock), grants the batch first fit in arrival order against all of
// them, and refills the home from the fullest other bucket (half of it),
// so this process's next batches coalesce at home again and the others'
// homes keep most of what they hold. A steal that finds at most the
// endgame left gathers the rest into bucket 0 instead (see WithEndgame),
// where every process's takes of the key end up.
//
// A take at home is refused (ErrSoldOut) only by a steal, while every
// bucket of the key is locked and all of them together cannot cover it in
// first-fit order: nobody is told "sold out" while the key's buckets hold
// enough. Takes that go elsewhere (to bucket 0 after a gather, or in a
// caller's transaction) fall back on takeAcross, which decides the same
// way.

// WithHome makes bucket b this Stock's home (by default a Stock has none
// and each take goes to a random bucket). Its takes of every key coalesce
// on their home bucket; when the home cannot cover a batch, one
// transaction across the key's buckets grants it and moves units into the
// home from the fullest other bucket. So give each process of a service its
// own home (its replica number modulo the buckets), and as many buckets as
// processes: then no two processes write one row until the key runs low.
// Two processes with one home still sell exactly, each halving the other's
// rate on that row. Credits (Accounts.Credit, CreditIn) go to the home
// too; Put still spreads its units over all buckets. TakeIn takes from the
// home in the caller's transaction, and across buckets when the home
// cannot cover it. b must lie in [0, buckets) and needs WithBuckets > 1.
func WithHome(b int) Option {
	return func(c *config) { c.used.Add(setHome); c.home, c.homeSet = b, true }
}

// validHome checks WithHome against the bucket count.
func validHome(c config) error {
	switch {
	case !c.homeSet:
		return nil
	case c.buckets == 1:
		return invalid("home needs buckets > 1")
	case c.home < 0 || c.home >= c.buckets:
		return invalid("home %d outside [0, %d)", c.home, c.buckets)
	}
	return nil
}

// bucketFor is the bucket a take or a credit of key goes to: bucket 0
// after an endgame gather seen here, else the home, else a random bucket.
func (s *Stock) bucketFor(key string) int {
	switch {
	case s.buckets == 1 || s.isGathered(key):
		return 0
	case s.home >= 0:
		return s.home
	default:
		return s.rand(s.buckets)
	}
}

// atHome reports whether coalesced takes of bucket b are answered by
// runHome, whose answers are final: a refusal already looked at every
// bucket.
func (s *Stock) atHome(b int) bool { return s.home >= 0 && b == s.home }

// runHome is the take combiner's statement for the home bucket: the plain
// decrement by the batch's sum while the home covers it (one statement,
// one row nobody else writes), and a steal when it does not.
func (s *Stock) runHome(ctx context.Context, k bucketKey, reqs []int64, gen uint64) ([]error, error) {
	if sum, ok := sumOf(reqs); ok {
		tag, err := s.pg.Exec(ctx, s.db, s.takeSQL, s.over.Args(k.key, k.bucket, sum)...)
		if err != nil {
			return nil, errfmt.Errorf("conditional: take %q: %w", k.key, classify(err))
		}
		if tag.RowsAffected() == 1 {
			return make([]error, len(reqs)), nil
		}
	}
	return s.steal(ctx, k, reqs, gen)
}

// steal runs a batch the home bucket k could not cover: in one
// transaction it locks every bucket of the key in ascending order, grants
// the requests first fit in arrival order against their total, and writes
// back the buckets that change (see refill and gatherFirst). It answers
// ErrSoldOut to each request the total cannot cover, and marks the key
// sold out only when the total is 0 (gen is the restock generation read
// before the batch's first statement). Once the commit is sent ctx (the
// batch's, ended when every take in it has given up) does not cancel it: if ctx
// ends first, steal stops waiting and returns ErrAmbiguousCommit, and the
// commit runs on, tracked by the Stock's Close (see Take).
func (s *Stock) steal(ctx context.Context, k bucketKey, reqs []int64, gen uint64) ([]error, error) {
	tx, err := s.pg.Begin(ctx, s.db)
	if err != nil {
		return nil, errfmt.Errorf("conditional: take %q across buckets: %w", k.key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	bucket, qty, total, err := s.lockBuckets(ctx, tx, k.key)
	if err != nil {
		return nil, err
	}
	if len(bucket) == 0 {
		return nil, ErrNotFound
	}
	errs, granted := firstFit(total, reqs)
	if total == 0 {
		s.markSoldOut(k.key, gen)
		s.setGathered(k.key, false)
	}
	if granted == 0 {
		return errs, nil // nothing to write; Rollback ends the transaction
	}
	gather := s.endgame > 0 && total <= s.endgame
	var newBuckets []int
	var newQty []int64
	if gather {
		newBuckets, newQty = gatherFirst(bucket, qty, total-granted)
	} else {
		newBuckets, newQty = refill(bucket, qty, k.bucket, granted)
	}
	if _, err := tx.Exec(ctx, s.acrossUpdateSQL, k.key, newBuckets, newQty); err != nil {
		return nil, errfmt.Errorf("conditional: take %q across buckets: %w", k.key, pgmode.Explain(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, errfmt.Errorf("conditional: take %q across buckets: %w", k.key, classify(err))
	}
	s.setGathered(k.key, gather) // a restock elsewhere ends an endgame seen here
	return errs, nil
}

// firstFit grants reqs in arrival order against total units, each one the
// rest still covers: errs holds ErrSoldOut for each refused request, and
// granted the units granted (at most total).
func firstFit(total int64, reqs []int64) (errs []error, granted int64) {
	errs = make([]error, len(reqs))
	for i, n := range reqs {
		if n > total-granted {
			errs[i] = ErrSoldOut
			continue
		}
		granted += n
	}
	return errs, granted
}

// refill takes n units from the locked buckets (which hold at least n
// between them) for a batch of the home bucket: from the home first, and
// when the home is short, from the other buckets fullest first, taking
// half of the fullest one's units more than the batch needs, which stay in
// the home for the next batches. It returns the buckets that change with
// their new units. A home without a row (the key has fewer buckets) is
// left out: the units come from the others, fullest first.
func refill(bucket []int, qty []int64, home int, n int64) ([]int, []int64) {
	h := -1
	for i, b := range bucket {
		if b == home {
			h = i
		}
	}
	if h < 0 {
		return takeFullest(bucket, qty, n)
	}
	if qty[h] >= n {
		return []int{home}, []int64{qty[h] - n}
	}
	need := n - qty[h]
	otherB := make([]int, 0, len(bucket)-1)
	otherQ := make([]int64, 0, len(bucket)-1)
	var others, fullest int64
	for i := range bucket {
		if i != h {
			otherB, otherQ = append(otherB, bucket[i]), append(otherQ, qty[i])
			others += min(qty[i], math.MaxInt64-others)
			fullest = max(fullest, qty[i])
		}
	}
	move := need + min(fullest-fullest/2, others-need) // others >= need: the buckets hold n
	newBuckets, newQty := takeFullest(otherB, otherQ, move)
	return append(newBuckets, home), append(newQty, move-need)
}
