package conditional

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/combine"
	"github.com/nolock/nolock/internal/pgarg"

	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
)

// Stock sells units of keys (SKUs, tickets, quota) from a PostgreSQL table,
// never below zero, without a lock around read-modify-write: the row decides.
//
// Every take is one conditional statement. Concurrent takes of one key in
// this process are coalesced (see WithCoalescing): one statement in flight
// per key, each granting a whole batch. Several processes may share a table;
// the row lock keeps them exact. For keys hotter than one row allows across
// processes, spread the stock over buckets (WithBuckets). Every Stock on a
// table must use the same WithBuckets: a take with more buckets than the
// key's rows still finds its units (it goes across the rows), but a Stock
// with one bucket sees only bucket 0 and answers ErrSoldOut while other
// buckets hold units.
//
// A Stock is safe for concurrent use. Close it to stop its goroutines.
type Stock struct {
	db                DB
	over              pgmode.Override // for statements on db outside a transaction
	table             string          // quoted
	keyArg, amountArg string
	buckets           int
	rand              func(n int) int

	batch *combine.Combiner[bucketKey, int64, struct{}]

	soldOutMu  sync.Mutex
	soldOut    map[string]time.Time // key → when this process saw it empty
	restocks   atomic.Uint64        // bumped, under soldOutMu, by every restock in this process
	soldOutTTL time.Duration
	now        func() time.Time

	endgame  int64               // gather a key's buckets into bucket 0 at this many units or fewer; 0: never
	gathered map[string]struct{} // keys this process saw gathered: their takes go to bucket 0
	gatherMu sync.Mutex

	adds *combine.Combiner[bucketKey, int64, struct{}]

	schemaSQL, batchSQL, takeSQL, addSQL, addFirstSQL, qtySQL, acrossSQL, acrossUpdateSQL, availableSQL, putSQL, openSQL string
}

// The statements, with {{table}} and {{qty}} replaced by quoted identifiers.
const (
	// One statement grants a batch of requests, first fit in arrival order:
	// o locks the row (waiting for, then reading, the newest version), g
	// walks the requests ($3) granting each one the rest covers, upd writes
	// the result only if something was granted. It returns the units before
	// the batch and one grant flag per request; no row means no such key.
	batchSQL = `WITH RECURSIVE
 o AS (SELECT {{qty}} AS qty FROM {{table}} WHERE key = $1 AND bucket = $2 FOR UPDATE),
 g(i, rest, ok) AS (
   SELECT 0, qty, true FROM o
   UNION ALL
   SELECT g.i + 1, CASE WHEN r.n <= g.rest THEN g.rest - r.n ELSE g.rest END, r.n <= g.rest
   FROM g, LATERAL (SELECT ($3::bigint[])[g.i + 1] AS n) r
   WHERE g.i < cardinality($3::bigint[])),
 fin AS (SELECT rest FROM g ORDER BY i DESC LIMIT 1),
 upd AS (UPDATE {{table}} s SET {{qty}} = fin.rest FROM fin, o
         WHERE s.key = $1 AND s.bucket = $2 AND fin.rest <> o.qty)
SELECT o.qty, (SELECT array_agg(ok ORDER BY i) FROM g WHERE i > 0) FROM o`
	// A batch of one is the plain conditional decrement: on the uncontended
	// path the library costs no more than the bare statement.
	takeSQL = `UPDATE {{table}} SET {{qty}} = {{qty}} - $3 WHERE key = $1 AND bucket = $2 AND {{qty}} >= $3`
	// addSQL adds to an existing row only (a credit), all of a batch at once.
	addSQL = `UPDATE {{table}} SET {{qty}} = {{qty}} + $3 WHERE key = $1 AND bucket = $2`
	// addFirstSQL adds to the key's first bucket: for a key with fewer
	// buckets than this Stock spreads over.
	addFirstSQL     = `UPDATE {{table}} SET {{qty}} = {{qty}} + $2 WHERE key = $1 AND bucket = (SELECT min(bucket) FROM {{table}} WHERE key = $1)`
	qtySQL          = `SELECT {{qty}} FROM {{table}} WHERE key = $1 AND bucket = $2`
	acrossSQL       = `SELECT bucket, {{qty}} FROM {{table}} WHERE key = $1 ORDER BY bucket FOR UPDATE`
	acrossUpdateSQL = `UPDATE {{table}} s SET {{qty}} = v.qty FROM unnest($2::int[], $3::bigint[]) AS v(bucket, qty)
WHERE s.key = $1 AND s.bucket = v.bucket`
	// availableSQL saturates at the largest bigint (buckets may hold more
	// between them than one int64) and is NULL for a key without rows
	// (least would skip the NULL).
	availableSQL = `SELECT (CASE WHEN sum({{qty}}) > 9223372036854775807 THEN 9223372036854775807 ELSE sum({{qty}}) END)::bigint
FROM {{table}} WHERE key = $1`
	// spread lays n out over the buckets, the remainder to the first ones.
	spread = `INSERT INTO {{table}} AS s (key, bucket, {{qty}})
SELECT $1, b, $2::bigint / $3::int + CASE WHEN b < $2::bigint % $3::int THEN 1 ELSE 0 END FROM generate_series(0, $3::int - 1) AS b
ON CONFLICT (key, bucket) `
	// Put adds n to the key's buckets, creating them if needed.
	putSQL = spread + `DO UPDATE SET {{qty}} = s.{{qty}} + EXCLUDED.{{qty}}`
	// openSQL creates the key's buckets only if the key has no bucket 0:
	// bucket 0 decides, so an Accounts with more buckets than the key was
	// opened with adds nothing (a per-row DO NOTHING added the new
	// buckets' share), and concurrent Opens queue on bucket 0's entry.
	openSQL = `WITH first AS (
  INSERT INTO {{table}} (key, bucket, {{qty}}) VALUES ($1, 0, $2::bigint / $3::int + CASE WHEN 0 < $2::bigint % $3::int THEN 1 ELSE 0 END)
  ON CONFLICT (key, bucket) DO NOTHING RETURNING 1)
INSERT INTO {{table}} (key, bucket, {{qty}})
SELECT $1, b, $2::bigint / $3::int + CASE WHEN b < $2::bigint % $3::int THEN 1 ELSE 0 END
FROM generate_series(1, $3::int - 1) AS b WHERE EXISTS (SELECT FROM first)
ON CONFLICT (key, bucket) DO NOTHING`
)

//go:embed stock.sql
var stockSQL string

// DefaultStockTable is the stock table's name unless WithStockTable says otherwise.
const DefaultStockTable = "nolock_stock"

type bucketKey struct {
	key    string
	bucket int
}

// StockOption configures NewStock.
type StockOption func(*stockConfig)

type stockConfig struct {
	table      string
	column     string // the quantity's column: qty, or balance for Accounts
	keyArg     string // what errors call a key: "key", or "account"
	amountArg  string // what errors call a quantity: "n", or "amount"
	buckets    int
	endgame    int64
	coalesce   bool
	maxBatch   int
	timeout    time.Duration
	soldOutTTL time.Duration
}

// WithStockTable sets the stock table's name (default "nolock_stock"). The name
// is quoted, never interpolated raw.
func WithStockTable(name string) StockOption { return func(c *stockConfig) { c.table = name } }

// WithBuckets spreads each key's stock over n rows (default 1). Takes go to
// a random bucket; when it cannot cover a request, one transaction takes
// across all buckets, so the last units always sell. Use buckets when
// several processes write one hot key; within one process coalescing is
// usually enough. Measure before choosing.
func WithBuckets(n int) StockOption { return func(c *stockConfig) { c.buckets = n } }

// WithEndgame gathers a key's units into its first bucket once a take
// across buckets finds at most units left (default 0: never). From then on
// this process sends the key's takes to that bucket, where they coalesce,
// instead of to random buckets that are mostly empty and each send the
// take across all buckets. The routing is this process's: another process
// follows when its own take across buckets finds at most its own endgame
// left (it needs WithEndgame too). A restock (Put, or a credit, in this
// process; any restock that a later take across buckets sees) sends takes
// to random buckets again; Put spreads only the units it adds. Only with
// WithBuckets.
func WithEndgame(units int64) StockOption { return func(c *stockConfig) { c.endgame = units } }

// WithCoalescing turns coalescing of concurrent takes of one key on (the
// default) or off. Off, the Stock still admits only one statement per key
// (bucket) at a time; the rest wait their turn in this process instead of
// piling onto the row lock.
func WithCoalescing(on bool) StockOption { return func(c *stockConfig) { c.coalesce = on } }

// WithMaxBatch bounds how many takes one statement grants (default 128).
func WithMaxBatch(n int) StockOption { return func(c *stockConfig) { c.maxBatch = n } }

// WithStatementTimeout bounds each statement (default 10 s). A take already
// sent waits for its statement's outcome, at most this long.
func WithStatementTimeout(d time.Duration) StockOption {
	return func(c *stockConfig) { c.timeout = d }
}

// WithSoldOutCache lets Take answer ErrSoldOut without a query for d after
// this process found every bucket of a key empty (default 0: off). Only
// takes outside a caller's transaction mark a key (one inside may roll back
// what it saw). Put, a credit or a CreditIn in this process clears the mark
// (a CreditIn even if its transaction rolls back), and a take that read
// the stock before such a restock never marks; a restock by another
// process is seen only after d.
func WithSoldOutCache(d time.Duration) StockOption {
	return func(c *stockConfig) { c.soldOutTTL = d }
}

// NewStock returns a Stock on db, usually a *pgxpool.Pool. Run its
// CreateSchema (or put its Schema in your migrations) first.
func NewStock(db DB, opts ...StockOption) (*Stock, error) {
	return newStock(db, stockConfig{table: DefaultStockTable, column: "qty", keyArg: "key", amountArg: "n"}, opts)
}

func newStock(db DB, cfg stockConfig, opts []StockOption) (*Stock, error) {
	cfg.buckets, cfg.coalesce, cfg.maxBatch, cfg.timeout = 1, true, 128, 10*time.Second
	for _, o := range opts {
		o(&cfg)
	}
	switch {
	case pgarg.NilDB(db):
		return nil, invalid("db is nil")
	case cfg.buckets < 1 || cfg.buckets > 1024:
		return nil, invalid("buckets %d outside [1, 1024]", cfg.buckets)
	case cfg.maxBatch < 1 || cfg.maxBatch > 10000:
		return nil, invalid("max batch %d outside [1, 10000]", cfg.maxBatch)
	case cfg.timeout <= 0:
		return nil, invalid("statement timeout %v is not positive", cfg.timeout)
	case cfg.soldOutTTL < 0:
		return nil, invalid("sold-out cache %v is negative", cfg.soldOutTTL)
	case cfg.endgame < 0:
		return nil, invalid("endgame %d is negative", cfg.endgame)
	case cfg.endgame > 0 && cfg.buckets == 1:
		return nil, invalid("endgame needs buckets > 1")
	}
	if err := pgarg.Ident("table", cfg.table, 0); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !cfg.coalesce {
		cfg.maxBatch = 1
	}
	t := pgx.Identifier{cfg.table}.Sanitize()
	sql := strings.NewReplacer("{{table}}", t, "{{qty}}", pgx.Identifier{cfg.column}.Sanitize()).Replace
	s := &Stock{
		db: db, over: pgmode.For(db), table: t, buckets: cfg.buckets, rand: rand.IntN, keyArg: cfg.keyArg, amountArg: cfg.amountArg,
		soldOut: map[string]time.Time{}, soldOutTTL: cfg.soldOutTTL, now: time.Now,
		endgame: cfg.endgame, gathered: map[string]struct{}{},
		schemaSQL: sql(stockSQL), batchSQL: sql(batchSQL), takeSQL: sql(takeSQL), addSQL: sql(addSQL), addFirstSQL: sql(addFirstSQL),
		qtySQL: sql(qtySQL), acrossSQL: sql(acrossSQL), acrossUpdateSQL: sql(acrossUpdateSQL),
		availableSQL: sql(availableSQL), putSQL: sql(putSQL), openSQL: sql(openSQL),
	}
	s.adds = combine.New(cfg.maxBatch, cfg.timeout, ErrClosed, errorsOnly(s.runAdd))
	s.batch = combine.New(cfg.maxBatch, cfg.timeout, ErrClosed, errorsOnly(s.runTake))
	return s, nil
}

// Take takes n units of key: nil means all n are yours; ErrSoldOut means
// none were taken because the stock cannot cover n; ErrUnknownKey means the
// key has no stock row. Takes are granted whole or not at all, first fit in
// arrival order, so a large request may be refused while a later, smaller
// one is granted.
//
// Cancelling ctx withdraws the take if it has not been sent yet. Once sent,
// Take waits for the statement's outcome, so nothing is taken behind the
// caller's back. ErrAmbiguousCommit means the connection failed after the
// statement was sent: read Available before retrying.
func (s *Stock) Take(ctx context.Context, key string, n int64) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return s.take(ctx, nil, key, n)
}

// TakeIn is Take inside the caller's transaction tx (any DB works; a
// pgx.Tx is the point): one plain conditional statement, not coalesced,
// whose effect commits or rolls back with tx. The row stays locked until
// tx ends, so keep tx short on a hot key.
func (s *Stock) TakeIn(ctx context.Context, tx DB, key string, n int64) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if pgarg.NilDB(tx) {
		return invalid("tx is nil")
	}
	return s.take(ctx, tx, key, n)
}

// take runs a take coalesced (tx nil) or in tx.
func (s *Stock) take(ctx context.Context, tx DB, key string, n int64) error {
	if err := s.valid(key, n); err != nil {
		return err
	}
	if s.cachedSoldOut(key) {
		return ErrSoldOut
	}
	if err := unsent(ctx, fmt.Sprintf("take %q", key)); err != nil {
		return err
	}
	b := 0
	if s.buckets > 1 && !s.isGathered(key) {
		b = s.rand(s.buckets)
	}
	var err error
	if tx == nil {
		_, err = s.batch.Do(ctx, bucketKey{key, b}, n)
	} else {
		var errs []error
		if errs, err = s.runOne(ctx, tx, true, bucketKey{key, b}, n); err == nil {
			err = errs[0] // the take's own outcome: nil or ErrSoldOut
		}
	}
	if s.buckets > 1 && (errors.Is(err, ErrSoldOut) || errors.Is(err, ErrUnknownKey)) {
		// This bucket cannot cover n; the others together may. A bucket
		// without a row (the key was stocked by a Stock with fewer
		// buckets) is not an unknown key: takeAcross reads every row.
		err = s.takeAcross(ctx, cmp.Or(tx, s.db), tx != nil, key, n)
	}
	return err
}

// overOn returns the Override for statements on db: the Stock's own db's,
// or, when inTx, the caller's transaction's (see pgmode).
func (s *Stock) overOn(db DB, inTx bool) pgmode.Override {
	if inTx {
		return pgmode.ForEach(db)
	}
	return s.over
}

// errorsOnly adapts an operation whose only answer per request is an error.
func errorsOnly(run func(context.Context, bucketKey, []int64) ([]error, error)) combine.Run[bucketKey, int64, struct{}] {
	return func(ctx context.Context, k bucketKey, reqs []int64) ([]struct{}, []error, error) {
		errs, err := run(ctx, k, reqs)
		return make([]struct{}, len(reqs)), errs, err
	}
}

// runTake is the take combiner's statement: one conditional update of one bucket
// for a batch of requests.
func (s *Stock) runTake(ctx context.Context, k bucketKey, reqs []int64) ([]error, error) {
	gen := s.restockGen()
	if len(reqs) == 1 {
		return s.runOne(ctx, s.db, false, k, reqs[0])
	}
	// While the stock covers the whole batch (all of a sale but its end),
	// the plain decrement by the batch's sum grants every request. A sum
	// past int64 cannot be covered: the first-fit statement sorts it out.
	if sum, ok := sumOf(reqs); ok {
		tag, err := pgerr.Exec(ctx, s.db, s.takeSQL, s.over.Args(k.key, k.bucket, sum)...)
		if err != nil {
			return nil, fmt.Errorf("conditional: take %q: %w", k.key, classify(err))
		}
		if tag.RowsAffected() == 1 {
			return make([]error, len(reqs)), nil
		}
	}
	var before int64
	var granted []bool
	err := pgerr.Row(ctx, s.db, s.batchSQL, s.over.Args(k.key, k.bucket, reqs)...).Scan(&before, &granted)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnknownKey
	}
	if err != nil {
		return nil, fmt.Errorf("conditional: take %q: %w", k.key, classify(err))
	}
	if len(granted) != len(reqs) {
		return nil, fmt.Errorf("conditional: take %q: %d grant flags for %d requests", k.key, len(granted), len(reqs))
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
	tag, err := pgerr.Exec(ctx, db, s.takeSQL, o.Args(k.key, k.bucket, n)...)
	if err != nil {
		return nil, fmt.Errorf("conditional: take %q: %w", k.key, classifyOn(db, err))
	}
	if tag.RowsAffected() == 1 {
		return []error{nil}, nil
	}
	var qty int64
	switch err := db.QueryRow(ctx, s.qtySQL, o.Args(k.key, k.bucket)...).Scan(&qty); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, ErrUnknownKey
	case err != nil:
		return nil, fmt.Errorf("conditional: take %q: %w", k.key, pgmode.Explain(err))
	}
	if qty == 0 && s.buckets == 1 && !inTx {
		s.markSoldOut(k.key, gen)
	}
	return []error{ErrSoldOut}, nil
}

// takeAcross takes n units from all of key's buckets in one transaction
// (a savepoint when db is itself a transaction), locking them in ascending
// order (every multi-row locker uses that order, and single-bucket
// statements lock one row, so no deadlock). inTx says db is the caller's
// transaction: what it sees may roll back, so it neither marks the key sold
// out nor gathers it for this process.
func (s *Stock) takeAcross(ctx context.Context, db DB, inTx bool, key string, n int64) error {
	gen := s.restockGen()
	// Sold-out short-circuit: one unlocked read sees a consistent snapshot
	// of all buckets; if they cannot cover n then, refusing is correct, and
	// the endgame's buyers do not queue for every bucket's lock.
	var seen *int64
	if err := db.QueryRow(ctx, s.availableSQL, s.overOn(db, inTx).Args(key)...).Scan(&seen); err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	switch {
	case seen == nil:
		return ErrUnknownKey
	case *seen < n:
		if *seen == 0 && !inTx {
			s.markSoldOut(key, gen)
		}
		return ErrSoldOut
	}
	tx, err := pgerr.Begin(ctx, db)
	if err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, s.acrossSQL, key)
	if err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	var bucket []int
	var qty []int64
	var total int64
	for rows.Next() {
		var b int
		var q int64
		if err := rows.Scan(&b, &q); err != nil {
			return fmt.Errorf("conditional: take %q across buckets: %w", key, err)
		}
		bucket, qty = append(bucket, b), append(qty, q)
		total += min(q, math.MaxInt64-total) // saturates: only total >= n matters past int64
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	switch {
	case len(bucket) == 0:
		return ErrUnknownKey
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
		// Endgame: everything left goes to the first bucket, where this
		// process's later takes of the key coalesce.
		for i := range bucket {
			want := int64(0)
			if i == 0 {
				want = total - n
			}
			if qty[i] != want {
				newBuckets, newQty = append(newBuckets, bucket[i]), append(newQty, want)
			}
		}
	}
	// Otherwise take from the fullest buckets first, leaving the rest to
	// single-bucket takes.
	for rest := n; rest > 0 && !gather; {
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
	_, err = tx.Exec(ctx, s.acrossUpdateSQL, key, newBuckets, newQty)
	if err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, pgmode.Explain(err))
	}
	// A take already sent waits for its outcome (see Take): the commit is
	// neither cancelled nor abandoned when ctx ends.
	if err := tx.Commit(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("conditional: take %q across buckets: %w", key, classifyOn(db, err))
	}
	if !inTx {
		s.setGathered(key, gather) // a restock elsewhere ends an endgame seen here
	}
	return nil
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
var errTooLarge = fmt.Errorf("the total would exceed %d", int64(math.MaxInt64))

// tooLarge reports whether err is PostgreSQL's numeric_value_out_of_range.
func tooLarge(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "22003"
}

// addOne adds n to an existing bucket of key; inTx says db is the
// caller's transaction.
func (s *Stock) addOne(ctx context.Context, db DB, inTx bool, k bucketKey, n int64) error {
	o := s.overOn(db, inTx)
	tag, err := pgerr.Exec(ctx, db, s.addSQL, o.Args(k.key, k.bucket, n)...)
	if err == nil && tag.RowsAffected() == 0 && s.buckets > 1 {
		tag, err = pgerr.Exec(ctx, db, s.addFirstSQL, o.Args(k.key, n)...) // the key may have fewer buckets
	}
	switch {
	case tooLarge(err):
		return fmt.Errorf("conditional: add %d to %q: %w (%w)", n, k.key, errTooLarge, err)
	case err != nil:
		return fmt.Errorf("conditional: add to %q: %w", k.key, classifyOn(db, err))
	case tag.RowsAffected() == 0:
		return ErrUnknownKey
	}
	return nil
}

// add adds n to a random existing bucket of key, coalesced (tx nil) or in tx.
func (s *Stock) add(ctx context.Context, tx DB, key string, n int64) error {
	if err := s.valid(key, n); err != nil {
		return err
	}
	if err := unsent(ctx, fmt.Sprintf("add to %q", key)); err != nil {
		return err
	}
	k := bucketKey{key, 0}
	if s.buckets > 1 {
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

// Put adds n units to key, creating it if needed: a restock or a return.
// With buckets, the units are spread evenly over them.
func (s *Stock) Put(ctx context.Context, key string, n int64) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := s.valid(key, n); err != nil {
		return err
	}
	return s.put(ctx, key, n)
}

// put adds n >= 0 units to key, creating its buckets if needed.
func (s *Stock) put(ctx context.Context, key string, n int64) error {
	if err := unsent(ctx, fmt.Sprintf("put %q", key)); err != nil {
		return err
	}
	_, err := pgerr.Exec(ctx, s.db, s.putSQL, s.over.Args(key, n, int64(s.buckets))...)
	s.restocked(key) // after an error too: it may hide a commit
	if tooLarge(err) {
		return fmt.Errorf("conditional: put %d to %q: a bucket's %w (%w)", n, key, errTooLarge, err)
	}
	if err != nil {
		return fmt.Errorf("conditional: put %q: %w", key, classify(err))
	}
	return nil
}

// valid checks a key and a positive quantity, naming them as this type's
// callers know them.
func (s *Stock) valid(key string, n int64) error {
	if err := validArg(s.keyArg, key); err != nil {
		return err
	}
	if n <= 0 {
		return invalid("%s must be positive, got %d", s.amountArg, n)
	}
	return nil
}

// Available returns the units of key not yet taken, summed over its
// buckets (at most math.MaxInt64). It is a snapshot: concurrent takes may
// change it at once.
func (s *Stock) Available(ctx context.Context, key string) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, err
	}
	if err := validArg(s.keyArg, key); err != nil {
		return 0, err
	}
	var n *int64
	if err := s.db.QueryRow(ctx, s.availableSQL, s.over.Args(key)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("conditional: available %q: %w", key, pgmode.Explain(err))
	}
	if n == nil {
		return 0, ErrUnknownKey
	}
	return *n, nil
}

// Schema returns the DDL of the Stock's table, for migration tools.
func (s *Stock) Schema() string { return s.schemaSQL }

// CreateSchema creates the Stock's table if it does not exist.
// It is safe to call from many processes at once: the DDL runs in one
// transaction that first takes nolock's schema advisory lock.
func (s *Stock) CreateSchema(ctx context.Context) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if err := pgschema.Create(ctx, s.db, s.schemaSQL); err != nil {
		return fmt.Errorf("conditional: create schema: %w", err)
	}
	return nil
}

// Close fails takes not yet sent with ErrClosed, waits for the statements
// in flight to be answered, and stops the Stock's goroutines. It is
// idempotent; the database handle is the caller's to close.
func (s *Stock) Close() error {
	s.batch.Close()
	s.adds.Close()
	return nil
}

func (s *Stock) cachedSoldOut(key string) bool {
	if s.soldOutTTL == 0 {
		return false
	}
	s.soldOutMu.Lock()
	defer s.soldOutMu.Unlock()
	at, ok := s.soldOut[key]
	return ok && s.now().Sub(at) < s.soldOutTTL
}

// restocked forgets that key was seen sold out (or gathered) in this
// process, and makes every take that read the stock before now unable to
// mark any key sold out: its read may predate this restock.
func (s *Stock) restocked(key string) {
	s.soldOutMu.Lock()
	s.restocks.Add(1)
	delete(s.soldOut, key)
	s.soldOutMu.Unlock()
	s.setGathered(key, false)
}

// restockGen returns the restock generation; a take reads it before sending
// its statement and passes it to markSoldOut.
func (s *Stock) restockGen() uint64 { return s.restocks.Load() }

// markSoldOut records that key was seen empty by a take that read the
// restock generation gen before its statement, unless a restock in this
// process happened since (the empty read may predate it).
func (s *Stock) markSoldOut(key string, gen uint64) {
	if s.soldOutTTL == 0 {
		return
	}
	s.soldOutMu.Lock()
	if s.restocks.Load() == gen {
		s.soldOut[key] = s.now()
	}
	s.soldOutMu.Unlock()
}

func (s *Stock) isGathered(key string) bool {
	if s.endgame == 0 {
		return false
	}
	s.gatherMu.Lock()
	defer s.gatherMu.Unlock()
	_, ok := s.gathered[key]
	return ok
}

func (s *Stock) setGathered(key string, on bool) {
	if s.endgame == 0 {
		return
	}
	s.gatherMu.Lock()
	defer s.gatherMu.Unlock()
	if on {
		s.gathered[key] = struct{}{}
	} else {
		delete(s.gathered, key)
	}
}
