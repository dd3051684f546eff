package conditional

import (
	"log/slog"
	"time"

	"github.com/nolock/nolock/internal/condcore"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/observe"
)

// Option configures this package's constructors: NewStock, NewAccounts,
// NewHolds and NewFenced take it. Each setter applies to some of them, and
// a constructor given one that does not apply to it returns ErrInvalid
// naming the setter, before any I/O:
//
//   - WithTable: NewStock, NewAccounts, NewHolds (NewFenced takes its
//     table as an argument)
//   - WithObserver: every constructor
//   - WithLogger, WithBuckets, WithHome, WithEndgame, WithCoalescing,
//     WithMaxBatch, WithSoldOutCache: NewStock and
//     NewAccounts (for Accounts a "sold out" key is an empty account, a
//     restock a credit)
//
// A nil Option is ErrInvalid too.
type Option func(*config)

// The setters of Option, one bit each, and their names in bit order.
const (
	setTable option.Used = 1 << iota
	setObserver
	setLogger
	setBuckets
	setHome
	setEndgame
	setCoalescing
	setMaxBatch
	setSoldOutCache
)

var setterNames = []string{"WithTable", "WithObserver", "WithLogger", "WithBuckets", "WithHome", "WithEndgame", "WithCoalescing", "WithMaxBatch", "WithSoldOutCache"}

// The setters each constructor takes (see Option).
const (
	stockSetters  = setTable | setObserver | setLogger | setBuckets | setHome | setEndgame | setCoalescing | setMaxBatch | setSoldOutCache
	holdsSetters  = setTable | setObserver
	fencedSetters = setObserver
)

// apply applies opts to cfg, refusing a nil one or one that ctor, which
// takes allowed, does not take.
func apply(cfg *config, opts []Option, ctor string, allowed option.Used) error {
	return condcore.Options(option.ApplyTo(cfg, &cfg.used, opts, setterNames, ctor, allowed))
}

// WithTable names the table (defaults: DefaultStockTable,
// DefaultAccountsTable, DefaultHoldsTable): one identifier of at most 63
// bytes, found through the search_path, quoted, never interpolated raw.
func WithTable(name string) Option { return func(c *config) { c.used.Add(setTable); c.table = name } }

// config is the settings Options make; each constructor reads its own.
type config struct {
	used       option.Used
	table      string
	column     string // the quantity's column: qty, or balance for Accounts
	keyArg     string // what errors call a key: "key", or "account"
	amountArg  string // what errors call a quantity: "n", or "amount"
	buckets    int
	home       int
	homeSet    bool
	endgame    int64
	coalesce   bool
	maxBatch   int
	soldOutTTL time.Duration
	obs        observe.Observer
	log        *slog.Logger
}

// WithLogger logs each coalesced statement that failed for its whole
// batch to l (nil, the default, discards): at Warn when its outcome is
// unknown ("conditional: commit outcome unknown"), otherwise at Debug
// ("conditional: statement failed"), with op ("take" or "add"), key,
// bucket, requests (the batch's size) and err. A statement that found no
// row (ErrNotFound) and refusals (sold out, insufficient balance) are
// answers, not failures, and are not logged. Statements run in a caller's
// transaction are that caller's to log. l is called on the goroutine that
// sent the statement, never with a lock held.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.used.Add(setLogger); c.log = l } }

// WithBuckets spreads each key's stock over n rows (default 1). Takes go to
// a random bucket, or to the Stock's home (WithHome); when it cannot cover
// a request, one transaction takes across all buckets, so the last units
// always sell. Use buckets, with a home per process, when several
// processes write one hot key; within one process coalescing is usually
// enough. Measure before choosing.
func WithBuckets(n int) Option { return func(c *config) { c.used.Add(setBuckets); c.buckets = n } }

// WithEndgame gathers a key's units into its first bucket once a take
// across buckets finds at most units left (default 0: never). From then on
// this process sends the key's takes to that bucket, where they coalesce,
// instead of to random buckets that are mostly empty and each send the
// take across all buckets. The routing is this process's: another process
// follows when its own take across buckets finds at most its own endgame
// left (it needs WithEndgame too). A restock (Put, or a credit, in this
// process; any restock that a later take across buckets sees) sends takes
// to random buckets again; Put spreads only the units it adds. A Stock
// remembers up to 65536 gathered keys; one forgotten to make room is
// routed at random until its next take across buckets. Only with
// WithBuckets.
func WithEndgame(units int64) Option {
	return func(c *config) { c.used.Add(setEndgame); c.endgame = units }
}

// WithCoalescing turns coalescing of concurrent takes of one key on (the
// default) or off. Off, the Stock still admits only one statement per key
// (bucket) at a time; the rest wait their turn in this process instead of
// piling onto the row lock.
func WithCoalescing(on bool) Option {
	return func(c *config) { c.used.Add(setCoalescing); c.coalesce = on }
}

// WithMaxBatch bounds how many takes one statement grants (default 128).
func WithMaxBatch(n int) Option { return func(c *config) { c.used.Add(setMaxBatch); c.maxBatch = n } }

// WithSoldOutCache lets Take answer ErrSoldOut without a query for d after
// this process found every bucket of a key empty (default 0: off). Only
// takes outside a caller's transaction mark a key (one inside may roll back
// what it saw). Put, a credit or a CreditIn in this process clears the mark
// (a CreditIn even if its transaction rolls back), and a take that read
// the stock before such a restock never marks; a restock by another
// process is seen only after d. The cache drops expired marks as it adds
// new ones and holds at most 65536 keys; a mark dropped early costs one
// query.
func WithSoldOutCache(d time.Duration) Option {
	return func(c *config) { c.used.Add(setSoldOutCache); c.soldOutTTL = d }
}
