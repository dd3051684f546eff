package conditional

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nolock/nolock/internal/combine"
	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

// Stock sells units of keys (SKUs, tickets, quota) from a PostgreSQL table,
// never below zero, without a lock around read-modify-write: the row decides.
//
// Every take is one conditional statement. Concurrent takes of one key in
// this process are coalesced (see WithCoalescing): one statement in flight
// per key, each granting a whole batch. Several processes may share a table;
// the row lock keeps them exact. For keys hotter than one row allows across
// processes, spread the stock over buckets (WithBuckets) and give each
// process a bucket of its own to coalesce on (WithHome). Every Stock on a
// table must use the same WithBuckets: a take with more buckets than the
// key's rows still finds its units (it goes across the rows), but a Stock
// with one bucket sees only bucket 0 and answers ErrSoldOut while other
// buckets hold units.
//
// A Stock is safe for concurrent use. Close it to stop its goroutines.
type Stock struct {
	db                DB
	obs               observe.Observer
	drained           *notify.Queue    // obs's, for the events of the combiners' drainers, which obs must not hold up
	outcome           condcore.Outcome // the events of a take: condcore.Take, or condcore.Debit for Accounts
	log               *slog.Logger     // never nil
	pg                *pgerr.Committer // its writes; Close waits for their commits
	over              pgmode.Override  // for statements on db outside a transaction
	table             string           // quoted
	keyArg, amountArg string
	buckets           int
	home              int // this Stock's home bucket (WithHome); -1: none
	rand              func(n int) int

	batch *combine.Combiner[bucketKey, int64, struct{}]

	soldOutMu      sync.Mutex
	soldOut        map[string]time.Time // key → when this process saw it empty
	restocks       atomic.Uint64        // bumped, under soldOutMu, by every restock in this process
	soldOutTTL     time.Duration
	soldOutSweepAt int // the cache's size at which markSoldOut sweeps it; guarded by soldOutMu
	now            func() time.Time

	endgame  int64               // gather a key's buckets into bucket 0 at this many units or fewer; 0: never
	gathered map[string]struct{} // keys this process saw gathered: their takes go to bucket 0
	gatherMu sync.Mutex

	adds *combine.Combiner[bucketKey, int64, struct{}]

	schemaSQL, batchSQL, takeSQL, addSQL, addFirstSQL, qtySQL, acrossSQL, acrossUpdateSQL, availableSQL, putSQL, openSQL string
}

// DefaultStockTable is the stock table's name unless WithTable says
// otherwise.
const DefaultStockTable = "nolock_stock"

type bucketKey struct {
	key    string
	bucket int
}

// NewStock returns a Stock on db, a *pgxpool.Pool: a *pgx.Conn or a pgx.Tx
// is refused with ErrInvalid (see DB; TakeIn takes them per call). Run its
// CreateSchema (or put its Schema in your migrations) first.
func NewStock(db DB, opts ...Option) (*Stock, error) {
	cfg := stockDefaults(config{table: DefaultStockTable, column: "qty", keyArg: "key", amountArg: "n"})
	if err := apply(&cfg, opts, "NewStock", stockSetters); err != nil {
		return nil, err
	}
	return newStock(db, cfg)
}

// stockDefaults sets the defaults both Stock and Accounts share.
func stockDefaults(cfg config) config {
	cfg.buckets, cfg.coalesce, cfg.maxBatch = 1, true, 128
	return cfg
}

func newStock(db DB, cfg config) (*Stock, error) {
	switch {
	case pgarg.NilDB(db):
		return nil, invalid("db is nil")
	case pgarg.Single(db) != "":
		return nil, invalid("db is %s: coalesced statements run concurrently on the Stock's goroutines; pass a *pgxpool.Pool, and your transaction to TakeIn, DebitIn or CreditIn", pgarg.Single(db))
	case cfg.buckets < 1 || cfg.buckets > 1024:
		return nil, invalid("WithBuckets(%d): outside [1, 1024]", cfg.buckets)
	case cfg.maxBatch < 1 || cfg.maxBatch > 10000:
		return nil, invalid("WithMaxBatch(%d): outside [1, 10000]", cfg.maxBatch)
	case cfg.soldOutTTL < 0:
		return nil, invalid("WithSoldOutCache(%v): negative", cfg.soldOutTTL)
	case cfg.endgame < 0:
		return nil, invalid("WithEndgame(%d): negative", cfg.endgame)
	case cfg.endgame > 0 && cfg.buckets == 1:
		return nil, invalid("WithEndgame needs WithBuckets above 1")
	}
	if err := validHome(cfg); err != nil {
		return nil, err
	}
	home := -1
	if cfg.homeSet {
		home = cfg.home
	}
	if err := pgarg.Ident("table", cfg.table, 0); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !cfg.coalesce {
		cfg.maxBatch = 1
	}
	if cfg.log == nil {
		cfg.log = slog.New(slog.DiscardHandler)
	}
	t := pgx.Identifier{cfg.table}.Sanitize()
	sql := strings.NewReplacer("{{table}}", t, "{{qty}}", pgx.Identifier{cfg.column}.Sanitize()).Replace
	pg := new(pgerr.Committer)
	s := &Stock{
		db: db, pg: pg, over: pg.For(db), table: t, buckets: cfg.buckets, home: home, rand: rand.IntN, keyArg: cfg.keyArg, amountArg: cfg.amountArg,
		soldOut: map[string]time.Time{}, soldOutTTL: cfg.soldOutTTL, now: time.Now,
		endgame: cfg.endgame, gathered: map[string]struct{}{}, obs: cfg.obs, drained: notify.New(cfg.obs, 1024), log: cfg.log, outcome: condcore.Take,
		schemaSQL: sql(stockSQL), batchSQL: sql(batchSQL), takeSQL: sql(takeSQL), addSQL: sql(addSQL), addFirstSQL: sql(addFirstSQL),
		qtySQL: sql(qtySQL), acrossSQL: sql(acrossSQL), acrossUpdateSQL: sql(acrossUpdateSQL),
		availableSQL: sql(availableSQL), putSQL: sql(putSQL), openSQL: sql(openSQL),
	}
	s.adds = combine.New(cfg.maxBatch, ErrClosed, s.errorsOnly("add", s.runAdd))
	s.batch = combine.New(cfg.maxBatch, ErrClosed, s.errorsOnly("take", s.runTake))
	return s, nil
}

// Take takes n units of key: nil means all n are yours; ErrSoldOut means
// none were taken because the stock cannot cover n; ErrNotFound means the
// key has no stock row. Takes are granted whole or not at all, first fit in
// arrival order, so a large request may be refused while a later, smaller
// one is granted.
//
// Cancelling ctx withdraws the take if it has not been sent yet. A take
// sent in a coalesced statement waits for the statement's outcome; the
// Stock stops waiting for it only once every take in it has given up (its
// ctx ended), so a slow server alone never cuts it short. A take across
// buckets stops waiting for its commit when ctx ends. A commit in flight
// is never cancelled: it runs on to its end (at most
// pgoutcome.CommitTimeout), and Close waits for it. ErrAmbiguousCommit
// means the take may have committed: the connection failed after the
// statement was sent, or the wait ended first. Read Available before
// retrying.
func (s *Stock) Take(ctx context.Context, key string, n int64) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	return s.take(ctx, nil, key, n)
}

// TakeIn is Take inside the caller's transaction tx: one plain conditional
// statement, not coalesced, whose effect commits or rolls back with tx,
// and never ErrAmbiguousCommit (your COMMIT decides). The row stays locked
// until tx ends, so keep tx short on a hot key. tx may also be a pool or a
// *pgx.Conn, where the take commits on its own (see DB).
func (s *Stock) TakeIn(ctx context.Context, tx DB, key string, n int64) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if pgarg.NilDB(tx) {
		return invalid("tx is nil")
	}
	return s.take(ctx, tx, key, n)
}

// take runs a take coalesced (tx nil) or in tx, and reports it. A refusal
// is the outcome's (ErrSoldOut, or ErrInsufficient for Accounts).
func (s *Stock) take(ctx context.Context, tx DB, key string, n int64) error {
	return condcore.ObservedErr(ctx, s.obs, s.outcome, false, observe.Event{Key: key, N: n}, func(ctx context.Context) error {
		err := s.takeOnce(ctx, tx, key, n)
		if errors.Is(err, ErrSoldOut) {
			return s.outcome.Refusals[0]
		}
		return err
	})
}

func (s *Stock) takeOnce(ctx context.Context, tx DB, key string, n int64) error {
	if err := s.valid(key, n); err != nil {
		return err
	}
	if s.cachedSoldOut(key) {
		return ErrSoldOut
	}
	if err := unsentKey(ctx, "take", key); err != nil {
		return err
	}
	b := s.bucketFor(key)
	var err error
	if tx == nil {
		_, err = s.batch.Do(ctx, bucketKey{key, b}, n)
		if s.atHome(b) {
			return err // a refusal at home already looked at every bucket
		}
	} else {
		var errs []error
		if errs, err = s.runOne(ctx, tx, true, bucketKey{key, b}, n); err == nil {
			err = errs[0] // the take's own outcome: nil or ErrSoldOut
		}
	}
	if s.buckets > 1 && (errors.Is(err, ErrSoldOut) || errors.Is(err, ErrNotFound)) {
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
		return s.pg.ForEach(db)
	}
	return s.over
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
	if err := unsentKey(ctx, "put", key); err != nil {
		return err
	}
	_, err := s.pg.Exec(ctx, s.db, s.putSQL, s.over.Args(key, n, int64(s.buckets))...)
	s.restocked(key) // after an error too: it may hide a commit
	if tooLarge(err) {
		return errfmt.Errorf("conditional: put %d to %q: a bucket's %w (%w)", n, key, errTooLarge, err)
	}
	if err != nil {
		return errfmt.Errorf("conditional: put %q: %w", key, classify(err))
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
	if err := s.over.QueryRow(ctx, s.db, s.availableSQL, key).Scan(&n); err != nil {
		return 0, errfmt.Errorf("conditional: available %q: %w", key, pgmode.Explain(err))
	}
	if n == nil {
		return 0, ErrNotFound
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
		return errfmt.Errorf("conditional: create schema: %w", err)
	}
	return nil
}

// Close fails takes not yet sent with ErrClosed, waits for the statements
// in flight to be answered (each waited for, at the latest, until its
// takes have all given up) and for the commits in flight whose callers
// stopped waiting (each bounded by pgoutcome.CommitTimeout), and stops the
// Stock's goroutines. It is idempotent; the database handle is the
// caller's to close.
func (s *Stock) Close() error {
	s.batch.Close()
	s.adds.Close()
	s.pg.Close()
	s.drained.Close() // after the statements in flight: obs gets every event
	return nil
}
