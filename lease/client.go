package lease

import (
	"context"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

// DB is what a Client needs from pgx: a *pgxpool.Pool. It may grow in
// later versions. Per handle:
//
//   - A pool: the Client's renewals, acquisitions and releases each take a
//     connection of their own, concurrently.
//   - A *pgx.Conn is refused (ErrInvalid): renewals run on the Client's
//     goroutines beside your calls, and a *pgx.Conn runs one statement at
//     a time. A renewal that timed out would also close it (pgx closes a
//     connection whose statement's context ended), after which no lock
//     could be renewed or taken again.
//   - A pgx.Tx is refused (ErrInvalid): every acquisition, renewal and
//     release must commit on its own for others to see it.
//
// A wrapper of yours that New cannot see through (to count statements or
// inject faults) is taken as is: it must be safe for concurrent use and
// commit each statement on its own, as a pool does.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults.
const (
	DefaultTable = "nolock_lease"
	DefaultLease = lockcore.DefaultLease // lease of a lock without a renewal
)

// Limits checked before any I/O.
const (
	MaxKeyLen   = 1024       // bytes of a key (a B-tree entry must fit in a third of a page)
	MaxDataLen  = 256 * 1024 // bytes of a data payload
	maxTableLen = 63         // PostgreSQL's identifier limit: longer names would be truncated
	maxPending  = 32         // acquiring statements with an unknown outcome one call remembers
)

// config is a Client's settings after its options.
type config struct {
	lockcore.Settings
	table     string
	lockDelay time.Duration
}

// Option configures a Client: WithTable, WithLease, WithHeartbeat,
// WithPoll, WithExpiryWarning, WithLockDelay, WithOwner, WithLogger,
// WithObserver, WithClock. Options are applied in order, then validated
// together by New.
type Option func(*config)

// WithTable sets the lease table's name (default DefaultTable), at most
// 63 bytes. It is quoted, never interpolated raw, and found through the
// search_path.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithLease sets the lease: how long a lock stays valid after its last
// renewal, on the database's clock (and, for the holder's own belief, a
// little less: see the package doc). Default DefaultLease; it must be at
// least a millisecond and at most 24 hours.
func WithLease(d time.Duration) Option { return func(c *config) { c.Lease = d } }

// WithHeartbeat sets how often a held lock renews its lease. It must be
// positive and at most half the lease; the default is a quarter of the
// lease.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.Heartbeat, c.Set.Heartbeat = d, true }
}

// WithPoll sets how often a waiting Acquire retries (each wait is jittered
// down to half of it, and cut short when the database says the holder's
// lease ends sooner). It must be positive and at most the lease. Default:
// a second, or a quarter of the lease if that is shorter.
func WithPoll(d time.Duration) Option { return func(c *config) { c.Poll, c.Set.Poll = d, true } }

// WithExpiryWarning sets the margin of (*Lock).Expiring: it is closed when
// less than margin of the lock's local validity (or of its maximum hold)
// is left. It must be at least 0 and less than the lease minus the
// heartbeat, so it stays silent while renewals succeed; the default is a
// quarter of the lease.
func WithExpiryWarning(margin time.Duration) Option {
	return func(c *config) { c.Warn, c.Set.Warn = margin, true }
}

// WithLockDelay sets Chubby's lock-delay: the Client does not acquire a
// lock whose holder's lease ran out without a release until d after its
// expiry (on the database's clock), so that the lapsed holder's requests
// still in flight can drain. A released lock is free at once. The delay
// is the acquiring Client's, not the holder's: give every Client of a
// table the same. It must be at least 0 (the default: no delay) and at
// most 24 hours.
func WithLockDelay(d time.Duration) Option { return func(c *config) { c.lockDelay = d } }

// WithOwner sets the owner name written to the lock rows, for people and
// tools reading the table and for HeldError (it plays no part in
// ownership, which the token decides). The default is the host name, a
// dash and a random UUID; an explicit name must not be empty.
func WithOwner(name string) Option { return func(c *config) { c.Owner, c.Set.Owner = name, true } }

// WithLogger sets the logger (nil, the default, discards). The Client logs
// retries at debug level and lost locks at warn level.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.Logger = l } }

// WithObserver reports the Client's events (EventAcquired,
// EventNotAcquired, EventContended, EventRenewed, EventRenewFailed,
// EventExpiring, EventLost, EventReleased, EventNotReleased: their
// fields are in their docs) to o (nil: none). Acquire, TryAcquire and a Lock's Release (and
// Close) are calls (CallAcquire, CallTryAcquire, CallRelease): Start,
// End with the outcome, and the call's events between, on the calling
// goroutine.
// The other events (a lock's renewals, its expiry and loss, the releases
// of Close) reach o on a goroutine of the Client's, in order, never
// blocking a renewal; Close waits until o has had them all.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.Observer = observe.Guard(o) }
}

// WithClock replaces time.Now as the Client's clock for its own deadlines.
// Only differences of its readings are used (time.Now's carry a monotonic
// reading, so a wall clock step changes nothing); waiting still uses real
// timers, and expiry on the database uses the database's clock. For tests.
func WithClock(now func() time.Time) Option { return func(c *config) { c.Now = now } }

// Client acquires locks stored as rows of one PostgreSQL table and keeps
// them alive with renewals. Run CreateSchema (or put Schema in your
// migrations) first.
//
// A Client is safe for concurrent use. Several goroutines may contend for
// the same key through one Client or through several; locks are not
// reentrant (acquiring a key this Client holds waits like anyone else).
// Close releases every lock it still holds and waits for its goroutines.
type Client struct {
	db   DB
	cfg  config
	k    *lockcore.Keeper
	pg   *pgerr.Committer // its writes; Close waits for their commits
	over pgmode.Override
	sql  statements
}

// New returns a Client on db, a *pgxpool.Pool (see DB: a *pgx.Conn and a
// pgx.Tx are refused with ErrInvalid). Options are validated before any I/O:
// invalid settings return an error wrapping ErrInvalid that names them.
// New does not contact the database.
func New(db DB, opts ...Option) (*Client, error) {
	cfg := config{Settings: lockcore.Defaults(), table: DefaultTable}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := cfg.validate(db); err != nil {
		return nil, err
	}
	pg := new(pgerr.Committer)
	c := &Client{db: db, cfg: cfg, pg: pg, over: pg.For(db), sql: newStatements(cfg.table)}
	c.k = lockcore.NewKeeper(lockcore.Config{
		Settings: cfg.Settings, Batch: true,
		Prefix: "lease", Renewal: "renewal", Calls: "statements", Store: "database",
		Events: lockcore.EventsOf("lease"),
		Closed: ErrClosed, Released: ErrReleased, LockLost: ErrLockLost, NotAcquired: ErrNotAcquired,
	}, backend{c})
	return c, nil
}

func (c *config) validate(db DB) error {
	if pgarg.NilDB(db) {
		return invalid("db is nil")
	}
	switch pgarg.Single(db) {
	case "a pgx.Tx":
		return invalid("db is a pgx.Tx: every acquisition, renewal and release must commit on its own; pass a *pgxpool.Pool")
	case "a *pgx.Conn":
		return invalid("db is a *pgx.Conn: renewals run beside your calls, and a connection runs one statement at a time; pass a *pgxpool.Pool")
	}
	switch {
	case c.table == "" || len(c.table) > maxTableLen:
		return invalid("table name %q must be 1 to %d bytes", c.table, maxTableLen)
	case strings.IndexByte(c.table, 0) >= 0 || !utf8.ValidString(c.table):
		return invalid("table name %q must be valid UTF-8 without NUL", c.table)
	case c.lockDelay < 0 || c.lockDelay > lockcore.MaxLease:
		return invalid("lock-delay %v must be between 0 and %v", c.lockDelay, lockcore.MaxLease)
	}
	if err := c.Check(); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Owner returns the owner name this Client writes to its lock rows.
func (c *Client) Owner() string { return c.cfg.Owner }

// Schema returns the DDL of the Client's table, for a migration tool.
func (c *Client) Schema() string { return c.sql.schema }

// CreateSchema creates the Client's table if it does not exist. It is safe
// to call from many processes at once: the DDL runs in one transaction
// that first takes nolock's schema advisory lock.
func (c *Client) CreateSchema(ctx context.Context) error {
	if ctx == nil {
		return invalid("ctx is nil")
	}
	if err := pgschema.Create(ctx, c.db, c.sql.schema); err != nil {
		return errfmt.Errorf("lease: create schema: %w", err)
	}
	return nil
}

// Close releases every lock the Client still holds (each as by
// (*Lock).Close), makes blocked Acquire calls return ErrClosed, and waits
// for all of the Client's goroutines to end, and for the commits of its
// writes still in flight (each bounded by pgoutcome.CommitTimeout). It is
// idempotent and safe to call concurrently; every call returns the first
// call's result: nil, or the releases that failed for another reason than
// a lost lock. Later calls of Acquire or TryAcquire return ErrClosed.
func (c *Client) Close() error {
	return c.k.Close(c.pg.Close) // then the commits whose callers stopped waiting
}
