package conditional

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/combine"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/observe"
)

// errorsOnly adapts an operation (op, for the log) whose only answer per
// request is an error, and logs its failures (see logFailed).
func (s *Stock) errorsOnly(op string, run func(context.Context, bucketKey, []int64) ([]error, error)) combine.Run[bucketKey, int64, struct{}] {
	return func(ctx context.Context, k bucketKey, reqs []int64) ([]struct{}, []error, error) {
		errs, err := run(ctx, k, reqs)
		if err != nil {
			s.logFailed(ctx, op, k, len(reqs), err)
		}
		return make([]struct{}, len(reqs)), errs, err
	}
}

// logFailed logs a coalesced statement that failed for its n requests (see
// WithLogger).
func (s *Stock) logFailed(ctx context.Context, op string, k bucketKey, n int, err error) {
	level, msg := slog.LevelDebug, "conditional: statement failed"
	switch {
	case errors.Is(err, ErrNotFound):
		return // an answer: the key has no row
	case errors.Is(err, ErrAmbiguousCommit):
		level, msg = slog.LevelWarn, "conditional: commit outcome unknown"
	}
	if s.log.Enabled(ctx, level) {
		s.log.LogAttrs(ctx, level, msg, slog.String("op", op), slog.String("key", k.key), slog.Int("bucket", k.bucket),
			slog.Int("requests", n), slog.Any("err", err))
	}
}

// runTake is the take combiner's statement: one conditional update of one bucket
// for a batch of requests.
func (s *Stock) runTake(ctx context.Context, k bucketKey, reqs []int64) ([]error, error) {
	gen := s.restockGen()
	if len(reqs) > 1 && s.obs != nil {
		s.drained.Notify(ctx, observe.Event{Name: EventBatch, Key: k.key + "#" + strconv.Itoa(k.bucket), N: int64(len(reqs))}) // the bucket's statement
	}
	if s.atHome(k.bucket) {
		return s.runHome(ctx, k, reqs, gen)
	}
	if len(reqs) == 1 {
		return s.runOne(ctx, s.db, false, k, reqs[0])
	}
	// While the stock covers the whole batch (all of a sale but its end),
	// the plain decrement by the batch's sum grants every request. A sum
	// past int64 cannot be covered: the first-fit statement sorts it out.
	if sum, ok := sumOf(reqs); ok {
		tag, err := s.pg.Exec(ctx, s.db, s.takeSQL, s.over.Args(k.key, k.bucket, sum)...)
		if err != nil {
			return nil, errfmt.Errorf("conditional: take %q: %w", k.key, classify(err))
		}
		if tag.RowsAffected() == 1 {
			return make([]error, len(reqs)), nil
		}
	}
	var before int64
	var granted []bool
	err := s.pg.Row(ctx, s.db, s.batchSQL, s.over.Args(k.key, k.bucket, reqs)...).Scan(&before, &granted)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, errfmt.Errorf("conditional: take %q: %w", k.key, classify(err))
	}
	if len(granted) != len(reqs) {
		return nil, errfmt.Errorf("conditional: take %q: %d grant flags for %d requests", k.key, len(granted), len(reqs))
	}
	if before == 0 && s.buckets == 1 {
		s.markSoldOut(k.key, gen)
	}
	errs := make([]error, len(reqs))
	for i, ok := range granted {
		if !ok {
			errs[i] = ErrSoldOut
		}
	}
	return errs, nil
}

// runOne takes n units of one bucket with the plain conditional decrement.
// Only when it changes nothing does a second read tell sold out from unknown.
// inTx says db is the caller's transaction, whose reads never mark the key
// sold out: the transaction may roll back what it saw.
func (s *Stock) runOne(ctx context.Context, db DB, inTx bool, k bucketKey, n int64) ([]error, error) {
	gen := s.restockGen()
	o := s.overOn(db, inTx)
	tag, err := committerOn(s.pg, db).Exec(ctx, db, s.takeSQL, o.Args(k.key, k.bucket, n)...)
	if err != nil {
		return nil, errfmt.Errorf("conditional: take %q: %w", k.key, classifyOn(db, err))
	}
	if tag.RowsAffected() == 1 {
		return []error{nil}, nil
	}
	var qty int64
	switch err := db.QueryRow(ctx, s.qtySQL, o.Args(k.key, k.bucket)...).Scan(&qty); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrNotFound
	case err != nil:
		return nil, errfmt.Errorf("conditional: take %q: %w", k.key, pgmode.Explain(err))
	}
	if qty == 0 && s.buckets == 1 && !inTx {
		s.markSoldOut(k.key, gen)
	}
	return []error{ErrSoldOut}, nil
}

// runAdd is the add combiner's statement: one unconditional increment of
// one bucket by the sum of a batch.
func (s *Stock) runAdd(ctx context.Context, k bucketKey, reqs []int64) ([]error, error) {
	if sum, ok := sumOf(reqs); ok {
		err := s.addOne(ctx, s.db, false, k, sum)
		if len(reqs) == 1 || !errors.Is(err, errTooLarge) {
			return make([]error, len(reqs)), err
		}
	}
	// The sum is past int64, or takes the row past it: one statement per
	// request, so each gets its own answer (those that overflow the column
	// fail alone).
	errs := make([]error, len(reqs))
	for i, n := range reqs {
		errs[i] = s.addOne(ctx, s.db, false, k, n)
	}
	return errs, nil
}

// sumOf adds up positive amounts; ok is false if the sum overflows int64.
func sumOf(reqs []int64) (sum int64, ok bool) {
	for _, n := range reqs {
		if n > math.MaxInt64-sum {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

// errTooLarge marks an add that would take a row past math.MaxInt64.
var errTooLarge = errfmt.Errorf("total would exceed %d", int64(math.MaxInt64))

// tooLarge reports whether err is PostgreSQL's numeric_value_out_of_range.
func tooLarge(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22003"
}

// addOne adds n to an existing bucket of key; inTx says db is the
// caller's transaction.
func (s *Stock) addOne(ctx context.Context, db DB, inTx bool, k bucketKey, n int64) error {
	o := s.overOn(db, inTx)
	tag, err := committerOn(s.pg, db).Exec(ctx, db, s.addSQL, o.Args(k.key, k.bucket, n)...)
	if err == nil && tag.RowsAffected() == 0 && s.buckets > 1 {
		tag, err = committerOn(s.pg, db).Exec(ctx, db, s.addFirstSQL, o.Args(k.key, n)...) // the key may have fewer buckets
	}
	switch {
	case tooLarge(err):
		return errfmt.Errorf("conditional: add %d to %q: %w (%w)", n, k.key, errTooLarge, err)
	case err != nil:
		return errfmt.Errorf("conditional: add to %q: %w", k.key, classifyOn(db, err))
	case tag.RowsAffected() == 0:
		return ErrNotFound
	}
	return nil
}

// add adds n to a random existing bucket of key, coalesced (tx nil) or in tx.
func (s *Stock) add(ctx context.Context, tx DB, key string, n int64) error {
	if err := s.valid(key, n); err != nil {
		return err
	}
	if err := unsentKey(ctx, "add to", key); err != nil {
		return err
	}
	k := bucketKey{key, 0}
	switch {
	case s.home >= 0:
		k.bucket = s.home
	case s.buckets > 1:
		k.bucket = s.rand(s.buckets)
	}
	var err error
	if tx != nil {
		err = s.addOne(ctx, tx, true, k, n)
	} else {
		_, err = s.adds.Do(ctx, k, n)
	}
	// Even in a transaction that may roll back, and after an error that may
	// hide a commit: forgetting a mark costs at most a query.
	s.restocked(key)
	return err
}
