package lease

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/owner"
	"github.com/nolock/nolock/internal/pgarg"
	"github.com/nolock/nolock/internal/pgerr"
	"github.com/nolock/nolock/internal/pgmode"
	"github.com/nolock/nolock/internal/pgschema"
	"github.com/nolock/nolock/observe"
)

// DB is what a Client needs from pgx: a *pgxpool.Pool satisfies it, and so
// does any wrapper of one (to count statements or inject faults). It must
// be safe for concurrent use, since renewals run beside the caller's own
// calls: a single *pgx.Conn is not, and a pgx.Tx is refused (every
// statement of a lease must commit on its own). It may grow in later
// versions.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Defaults.
const (
	DefaultTable   = "nolock_lease"
	DefaultLease   = 20 * time.Second // lease of a lock without a renewal
	DefaultPollMax = time.Second      // a waiter tries at least this often (lease/4 if shorter)
)

// Limits checked before any I/O.
const (
	MaxKeyLen   = 1024       // bytes of a key (a B-tree entry must fit in a third of a page)
	MaxDataLen  = 256 * 1024 // bytes of a data payload
	MaxLease    = 24 * time.Hour
	maxTableLen = 63 // PostgreSQL's identifier limit: longer names would be truncated
	maxOwnerLen = 1024
	maxPending  = 32 // acquiring statements with an unknown outcome one call remembers
)

// config is a Client's settings after its options.
type config struct {
	table                        string
	lease, heartbeat, poll, warn time.Duration
	lockDelay                    time.Duration
	set                          struct{ heartbeat, poll, warn, owner bool }
	owner                        string
	logger                       *slog.Logger
	observer                     observe.Observer
	now                          func() time.Time
}

// Option configures a Client. Options are applied in order, then validated
// together by New.
type Option func(*config)

// WithTable sets the lease table's name (default DefaultTable), at most
// 63 bytes. It is quoted, never interpolated raw, and found through the
// search_path.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithLease sets the lease: how long a lock stays valid after its last
// renewal, on the database's clock (and, for the holder's own belief, a
// little less: see the package doc). Default DefaultLease; it must be at
// least a millisecond and at most MaxLease.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithHeartbeat sets how often a held lock renews its lease. It must be
// positive and at most half the lease; the default is a quarter of the
// lease.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.heartbeat, c.set.heartbeat = d, true }
}

// WithPoll sets how often a waiting Acquire retries (each wait is jittered
// down to half of it, and cut short when the database says the holder's
// lease ends sooner). It must be positive and at most the lease. Default:
// a second, or a quarter of the lease if that is shorter.
func WithPoll(d time.Duration) Option { return func(c *config) { c.poll, c.set.poll = d, true } }

// WithExpiryWarning sets the margin of (*Lock).Expiring: it is closed when
// less than margin of the lock's local validity (or of its maximum hold)
// is left. It must be at least 0 and less than the lease minus the
// heartbeat, so it stays silent while renewals succeed; the default is a
// quarter of the lease.
func WithExpiryWarning(margin time.Duration) Option {
	return func(c *config) { c.warn, c.set.warn = margin, true }
}

// WithLockDelay sets Chubby's lock-delay: a lock whose holder's lease ran
// out without a release cannot be acquired until d after its expiry (on
// the database's clock), so that the lapsed holder's requests still in
// flight can drain. A released lock is free at once. It must be at least
// 0 (the default: no delay) and at most MaxLease.
func WithLockDelay(d time.Duration) Option { return func(c *config) { c.lockDelay = d } }

// WithOwner sets the owner name written to the lock rows, for people and
// tools reading the table and for HeldError (it plays no part in
// ownership, which the token decides). The default is the host name, a
// dash and a random UUID; an explicit name must not be empty.
func WithOwner(name string) Option { return func(c *config) { c.owner, c.set.owner = name, true } }

// WithLogger sets the logger (nil, the default, discards). The Client logs
// retries at debug level and lost locks at warn level.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithObserver reports the Client's events (EventAcquired,
// EventNotAcquired, EventContended, EventRenewed, EventRenewFailed,
// EventExpiring, EventLost, EventReleased: their fields are in their
// docs) to o (nil: none). Events reach o on a goroutine of the Client's,
// in order, never blocking a renewal; Close waits until o has had them
// all.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.observer = observe.Guard(o) }
}

// WithClock replaces time.Now as the Client's clock for its own deadlines.
// Only differences of its readings are used (time.Now's carry a monotonic
// reading, so a wall clock step changes nothing); waiting still uses real
// timers, and expiry on the database uses the database's clock. For tests.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// Client acquires locks stored as rows of one PostgreSQL table and keeps
// them alive with renewals. Run CreateSchema (or put Schema in your
// migrations) first.
//
// A Client is safe for concurrent use. Several goroutines may contend for
// the same key through one Client or through several; locks are not
// reentrant (acquiring a key this Client holds waits like anyone else).
// Close releases every lock it still holds and waits for its goroutines.
type Client struct {
	db     DB
	cfg    config
	log    *slog.Logger
	events *notify.Queue    // nil without an observer
	pg     *pgerr.Committer // its writes; Close waits for their commits
	over   pgmode.Override
	sql    statements

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	locks  map[*Lock]struct{}
	wg     sync.WaitGroup // Acquire calls, renewal and cleanup goroutines

	closeOnce sync.Once
	closeErr  error
}

// New returns a Client on db. Options are validated before any I/O:
// invalid settings return an error wrapping ErrInvalid that names them.
// New does not contact the database.
func New(db DB, opts ...Option) (*Client, error) {
	cfg := config{table: DefaultTable, lease: DefaultLease, now: time.Now}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := cfg.validate(db); err != nil {
		return nil, err
	}
	log := cfg.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pg := new(pgerr.Committer)
	return &Client{
		db: db, cfg: cfg, log: log, events: notify.New(cfg.observer, 1024), pg: pg, over: pg.For(db), sql: newStatements(cfg.table),
		ctx: ctx, cancel: cancel, locks: make(map[*Lock]struct{}),
	}, nil
}

func (c *config) validate(db DB) error {
	if pgarg.NilDB(db) {
		return invalid("db is nil")
	}
	if _, ok := db.(pgx.Tx); ok {
		return invalid("db is a transaction; pass a pool")
	}
	switch {
	case c.table == "" || len(c.table) > maxTableLen:
		return invalid("table name %q must be 1 to %d bytes", c.table, maxTableLen)
	case strings.IndexByte(c.table, 0) >= 0 || !utf8.ValidString(c.table):
		return invalid("table name %q must be valid UTF-8 without NUL", c.table)
	case c.lease < time.Millisecond || c.lease > MaxLease:
		return invalid("lease %v must be between 1ms and %v", c.lease, MaxLease)
	case c.lockDelay < 0 || c.lockDelay > MaxLease:
		return invalid("lock-delay %v must be between 0 and %v", c.lockDelay, MaxLease)
	case c.now == nil:
		return invalid("clock is nil")
	}
	if !c.set.heartbeat {
		c.heartbeat = c.lease / 4
	}
	if c.heartbeat <= 0 || c.heartbeat > c.lease/2 {
		return invalid("heartbeat %v must be positive and at most half the lease %v", c.heartbeat, c.lease)
	}
	if !c.set.poll {
		c.poll = min(DefaultPollMax, c.lease/4)
	}
	if c.poll <= 0 || c.poll > c.lease {
		return invalid("poll %v must be positive and at most the lease %v", c.poll, c.lease)
	}
	if !c.set.warn {
		c.warn = c.lease / 4
	}
	if c.warn < 0 || c.warn >= c.lease-c.heartbeat {
		return invalid("expiry warning %v must be at least 0 and less than the lease minus the heartbeat (%v)", c.warn, c.lease-c.heartbeat)
	}
	if c.set.owner && c.owner == "" {
		return invalid("WithOwner(\"\"): give a name, or leave the option out for a generated one")
	}
	if !c.set.owner {
		c.owner = owner.Default()
	}
	if len(c.owner) > maxOwnerLen || strings.IndexByte(c.owner, 0) >= 0 || !utf8.ValidString(c.owner) {
		return invalid("owner name %q must be at most %d bytes of UTF-8 without NUL", c.owner, maxOwnerLen)
	}
	return nil
}

// callTimeout bounds one renewal so that one whose answer never comes
// leaves about two retries within the lease.
func (c *config) callTimeout() time.Duration { return (c.lease - c.heartbeat) / 3 }

// releaseTimeout bounds one release attempt, so that a release whose
// answer never comes is retried within Close's budget of one lease.
func (c *config) releaseTimeout() time.Duration { return c.lease / 4 }

// Owner returns the owner name this Client writes to its lock rows.
func (c *Client) Owner() string { return c.cfg.owner }

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

// enter registers a goroutine or a call that Close must wait for.
func (c *Client) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.wg.Add(1)
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
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		locks := make([]*Lock, 0, len(c.locks))
		for l := range c.locks {
			locks = append(locks, l)
		}
		c.mu.Unlock()
		c.cancel()
		errs := make([]error, len(locks))
		var wg sync.WaitGroup
		for i, l := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.Close(); err != nil && !errors.Is(err, ErrLockLost) {
					errs[i] = err
				}
			}()
		}
		wg.Wait()
		c.wg.Wait()
		c.pg.Close() // commits whose callers stopped waiting
		c.events.Close()
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

// forget removes a lock that has ended from the Client's set.
func (c *Client) forget(l *Lock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.locks, l)
}
