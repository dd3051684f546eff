package conditional

import (
	"context"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/observed"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/observe"
)

// takeAcross takes n units from all of key's buckets in one transaction
// (a savepoint when db is itself a transaction), locking them in ascending
// order (every multi-row locker uses that order, and single-bucket
// statements lock one row, so no deadlock). inTx says db is the caller's
// transaction: what it sees may roll back, so it neither marks the key sold
// out nor gathers it for this process.
//
// It grants all n or nothing: the units are written back only if the
// locked buckets hold at least n between them, and the write commits with
// the locks still held. Once the commit is sent ctx does not cancel it: if
// ctx ends first, takeAcross stops waiting and returns ErrAmbiguousCommit,
// and the commit runs on, tracked by the Stock's Close (see Take); on a
// *pgx.Conn given per call, takeAcross waits for it instead.
func (s *Stock) takeAcross(ctx context.Context, db DB, inTx bool, key string, n int64) error {
	gen := s.restockGen()
	if err := s.coverable(ctx, db, inTx, key, n, gen); err != nil {
		return err
	}
	tx, err := committerOn(s.pg, db).Begin(ctx, db)
	if err != nil {
		return errfmt.Errorf("conditional: take %q across buckets: %w", key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	bucket, qty, total, err := s.lockBuckets(ctx, tx, key)
	if err != nil {
		return err
	}
	switch {
	case len(bucket) == 0:
		return ErrNotFound
	case total == 0:
		if !inTx {
			s.markSoldOut(key, gen)
			s.setGathered(key, false)
		}
		return ErrSoldOut
	case total < n:
		return ErrSoldOut
	}
	var newBuckets []int
	var newQty []int64
	gather := s.endgame > 0 && total <= s.endgame
	if gather {
		newBuckets, newQty = gatherFirst(bucket, qty, total-n)
	} else {
		newBuckets, newQty = takeFullest(bucket, qty, n)
	}
	_, err = tx.Exec(ctx, s.acrossUpdateSQL, key, newBuckets, newQty)
	if err != nil {
		return errfmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return errfmt.Errorf("conditional: take %q across buckets: %w", key, classifyOn(db, err))
	}
	if !inTx {
		s.setGathered(key, gather) // a restock elsewhere ends an endgame seen here
		if gather {
			observed.Event(s.obs, ctx, observe.Event{Name: EventGathered, Key: key, N: total - n})
		}
	}
	return nil
}

// coverable is takeAcross's sold-out short-circuit: one unlocked read sees
// a consistent snapshot of all buckets; if they cannot cover n then,
// refusing is correct (ErrSoldOut, or ErrNotFound for a key without
// rows), and the endgame's buyers do not queue for every bucket's lock.
// nil means the take may go on to lock the buckets.
func (s *Stock) coverable(ctx context.Context, db DB, inTx bool, key string, n int64, gen uint64) error {
	var seen *int64
	if err := db.QueryRow(ctx, s.availableSQL, s.overOn(db, inTx).Args(key)...).Scan(&seen); err != nil {
		return errfmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	switch {
	case seen == nil:
		return ErrNotFound
	case *seen < n:
		if *seen == 0 && !inTx {
			s.markSoldOut(key, gen)
		}
		return ErrSoldOut
	}
	return nil
}

// lockBuckets locks key's buckets in tx, in ascending order, and returns
// each one's number and units, and their total (saturated at
// math.MaxInt64: only total >= n matters past int64).
func (s *Stock) lockBuckets(ctx context.Context, tx pgx.Tx, key string) (bucket []int, qty []int64, total int64, err error) {
	rows, err := tx.Query(ctx, s.acrossSQL, key)
	if err != nil {
		return nil, nil, 0, errfmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	for rows.Next() {
		var b int
		var q int64
		if err := rows.Scan(&b, &q); err != nil {
			return nil, nil, 0, errfmt.Errorf("conditional: take %q across buckets: %w", key, err)
		}
		bucket, qty = append(bucket, b), append(qty, q)
		total += min(q, math.MaxInt64-total)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, errfmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	return bucket, qty, total, nil
}

// gatherFirst is the endgame's write: everything left (left units) goes to
// the first bucket, where this process's later takes of the key coalesce,
// and every other bucket to 0. It returns only the buckets that change.
func gatherFirst(bucket []int, qty []int64, left int64) ([]int, []int64) {
	var newBuckets []int
	var newQty []int64
	for i := range bucket {
		want := int64(0)
		if i == 0 {
			want = left
		}
		if qty[i] != want {
			newBuckets, newQty = append(newBuckets, bucket[i]), append(newQty, want)
		}
	}
	return newBuckets, newQty
}

// takeFullest takes n units from the fullest buckets first, leaving the
// rest to single-bucket takes; the buckets hold at least n between them.
// It returns the buckets it takes from with their new units, each bucket
// once: a bucket it empties is never the fullest again while units are
// still wanted, since the others then hold them.
func takeFullest(bucket []int, qty []int64, n int64) ([]int, []int64) {
	var newBuckets []int
	var newQty []int64
	for rest := n; rest > 0; {
		best := 0
		for i := range qty {
			if qty[i] > qty[best] {
				best = i
			}
		}
		d := min(rest, qty[best])
		qty[best] -= d
		rest -= d
		newBuckets, newQty = append(newBuckets, bucket[best]), append(newQty, qty[best])
	}
	return newBuckets, newQty
}

// isGathered reports whether this process saw key's units gathered into
// its first bucket (the endgame, see WithEndgame): its takes then go to
// that bucket instead of a random one.
func (s *Stock) isGathered(key string) bool {
	if s.endgame == 0 {
		return false
	}
	s.gatherMu.Lock()
	defer s.gatherMu.Unlock()
	_, ok := s.gathered[key]
	return ok
}

// maxGathered bounds the keys a Stock remembers as gathered. A key
// forgotten to make room has its takes sent to random buckets again; the
// next take across buckets that finds it at its endgame remembers it
// again. Routing only: no answer depends on it.
const maxGathered = 65536

// setGathered records whether key's units are gathered, as seen by this
// process; a no-op without WithEndgame.
func (s *Stock) setGathered(key string, on bool) {
	if s.endgame == 0 {
		return
	}
	s.gatherMu.Lock()
	defer s.gatherMu.Unlock()
	if on {
		if _, ok := s.gathered[key]; !ok && len(s.gathered) >= maxGathered {
			for k := range s.gathered { // any one: forgetting costs routing, not exactness
				delete(s.gathered, k)
				break
			}
		}
		s.gathered[key] = struct{}{}
	} else {
		delete(s.gathered, key)
	}
}
