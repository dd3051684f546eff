package dynamolock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nolock/nolock/internal/errfmt"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/notify"
	"github.com/nolock/nolock/internal/option"
	"github.com/nolock/nolock/internal/owner"
	"github.com/nolock/nolock/observe"
)

// DynamoDBAPI is what a Client needs from DynamoDB: a *dynamodb.Client
// satisfies it, and so does any wrapper of one (to count calls or inject
// faults). It may grow in later versions.
//
// Every conditional write is sent with a per-call option that lets the SDK
// retry it only after an attempt that changed nothing (throttling, with
// the SDK's backoff, or a failed dial), never after one whose answer was
// lost: the Client resolves such a write itself, by reading the item back
// or by a retry conditional on its own record version. A wrapper should
// pass the options on.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
}

// Defaults, the Java lock client's where it has one.
const (
	DefaultLease   = 20 * time.Second // lease of a lock without a heartbeat
	DefaultPollMax = time.Second      // a waiter reads the item at least this often (lease/4 if shorter)
)

// Limits checked before any I/O.
const (
	MaxKeyLen     = 2048       // bytes of a partition key value (DynamoDB's limit)
	MaxSortKeyLen = 1024       // bytes of a sort key value (DynamoDB's limit)
	MaxDataLen    = 350 * 1024 // bytes of a data payload, leaving room in DynamoDB's 400 KB item
	maxOwnerLen   = 1024
	maxPending    = 32 // RVNs of writes with unknown outcome a lock remembers
)

// config is a Client's settings after its options.
type config struct {
	pkName, skName string
	lease          time.Duration
	heartbeat      time.Duration                                  // unset: lease/4
	poll           time.Duration                                  // unset: min(DefaultPollMax, lease/4)
	warning        time.Duration                                  // unset: lease/4
	set            struct{ heartbeat, poll, warning, owner bool } // which of these an option gave
	owner          string
	logger         *slog.Logger
	observer       observe.Observer
	now            func() time.Time
	fencing        bool
}

// Option configures a Client. Options are applied in order, then validated
// together by New.
type Option func(*config)

// WithKeyAttributes names the table's partition key attribute (a string;
// default "key", as in the Java lock client) and its sort key attribute
// (a string; "" for none, the default). With a sort key every acquisition
// must give the sort key value (WithSortKey); locks with the same
// partition key and different sort keys are independent.
func WithKeyAttributes(partition, sort string) Option {
	return func(c *config) { c.pkName, c.skName = partition, sort }
}

// WithLease sets the lease: how long a lock stays valid on the holder's
// clock after its last confirmed write, and how long a waiter must see the
// item unchanged, on its own clock, before it takes the lock over. Default
// DefaultLease; it must be at least a millisecond and at most 24 hours.
func WithLease(d time.Duration) Option { return func(c *config) { c.lease = d } }

// WithHeartbeat sets how often a held lock writes a new record version
// number. It must be positive and at most half the lease; the default is a
// quarter of the lease.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.heartbeat, c.set.heartbeat = d, true }
}

// WithPoll sets how often a waiting Acquire reads the lock item (each wait
// is jittered down to half of it); it must be positive. It bounds how late a waiter notices a
// release or an expired lease: a dead holder's lock is taken over at most
// one lease plus one poll after its last heartbeat. Default: a second, or
// a quarter of the lease if that is shorter; at most the lease.
func WithPoll(d time.Duration) Option { return func(c *config) { c.poll, c.set.poll = d, true } }

// WithExpiryWarning sets the margin of (*Lock).Expiring: it is closed when
// less than margin of the lock's local validity (or of its maximum hold)
// is left. It must be at least 0 and less than the lease minus the
// heartbeat, so it stays silent while heartbeats succeed; the default is a
// quarter of the lease.
func WithExpiryWarning(margin time.Duration) Option {
	return func(c *config) { c.warning, c.set.warning = margin, true }
}

// WithOwner sets the owner name written to the lock items, for people and
// tools reading the table (it plays no part in ownership, which the record
// version number decides). The default is the host name, a dash and a
// random UUID, as AWS's Java lock client names its owners; an explicit
// name must not be empty.
func WithOwner(name string) Option { return func(c *config) { c.owner, c.set.owner = name, true } }

// WithLogger sets the logger (nil, the default, discards). The Client logs
// retries at debug level and lost locks at warn level.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithObserver reports the Client's events (EventAcquired,
// EventNotAcquired, EventContended, EventTakeover, EventRenewed,
// EventRenewFailed, EventExpiring, EventLost, EventReleased: their fields
// are in their docs) to o (nil: none). Events reach o on a goroutine of
// the Client's, in order, never blocking a heartbeat; Close waits until o
// has had them all.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.observer = observe.Guard(o) }
}

// WithClock replaces time.Now as the Client's clock. Only differences of
// its readings are used (time.Now's carry a monotonic reading, so a wall
// clock step changes nothing); waiting still uses real timers. For tests.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithoutFencing turns the fencing token off: Release deletes the lock item
// (the Java client's default) instead of marking it released, so the
// counter would restart; Token returns 0 and the fencing helpers refuse.
func WithoutFencing() Option { return func(c *config) { c.fencing = false } }

// Client acquires locks stored as items of one DynamoDB table and keeps
// them alive with heartbeats. The table needs a string partition key
// (named "key" unless WithKeyAttributes says otherwise) and, optionally,
// a string sort key (WithKeyAttributes); the Client does not create it.
//
// A Client is safe for concurrent use. Several goroutines may contend for
// the same key through one Client or through several; locks are not
// reentrant (acquiring a key this Client holds waits like anyone else).
// Close releases every lock it still holds and waits for its goroutines.
type Client struct {
	api    DynamoDBAPI
	table  string
	cfg    config
	log    *slog.Logger
	events *notify.Queue // nil without an observer
	seen   *sightings

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	locks  map[*Lock]struct{}
	wg     sync.WaitGroup // Acquire calls, heartbeat and cleanup goroutines

	closeOnce sync.Once
	closeErr  error
}

// New returns a Client for table. Options are validated before any I/O:
// invalid settings return an error wrapping ErrInvalid that names them.
// New does not contact DynamoDB.
func New(client DynamoDBAPI, table string, opts ...Option) (*Client, error) {
	cfg := config{pkName: "key", lease: DefaultLease, now: time.Now, fencing: true}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := cfg.validate(client, table); err != nil {
		return nil, err
	}
	log := cfg.logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		api: client, table: table, cfg: cfg, log: log, events: notify.New(cfg.observer, 1024), seen: newSightings(defaultSightings),
		ctx: ctx, cancel: cancel, locks: make(map[*Lock]struct{}),
	}, nil
}

func (c *config) validate(client DynamoDBAPI, table string) error {
	switch {
	case ddbarg.NilClient(client):
		return invalid("client is nil")
	}
	if err := ddbarg.Table("table", table); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := ddbarg.KeyAttributes(c.pkName, c.skName, OwnerAttr, RVNAttr, LeaseAttr, ReleasedAttr, DataAttr, TokenAttr); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	switch {
	case c.lease < time.Millisecond || c.lease > maxLease:
		return invalid("lease %v must be between 1ms and %v", c.lease, maxLease)
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
	if !c.set.warning {
		c.warning = c.lease / 4
	}
	if c.warning < 0 || c.warning >= c.lease-c.heartbeat {
		return invalid("expiry warning %v must be at least 0 and less than the lease minus the heartbeat (%v)", c.warning, c.lease-c.heartbeat)
	}
	if c.set.owner && c.owner == "" {
		return invalid("WithOwner(\"\"): give a name, or leave the option out for a generated one")
	}
	if !c.set.owner {
		c.owner = owner.Default()
	}
	if len(c.owner) > maxOwnerLen {
		return invalid("owner name is %d bytes, more than %d", len(c.owner), maxOwnerLen)
	}
	if !utf8.ValidString(c.owner) {
		return invalid("owner name %q is not valid UTF-8", c.owner)
	}
	return nil
}

// callTimeout bounds one heartbeat call so that a call whose answer never
// comes leaves about two retries within the lease, whatever the heartbeat
// (even the largest allowed, half the lease). The timed-out write stays
// pending, so a retry conditional on its RVN succeeds whether it applied
// or not.
func (c *config) callTimeout() time.Duration {
	return (c.lease - c.heartbeat) / 3
}

// releaseTimeout bounds one release attempt, so that a release whose
// answer never comes is retried within Close's budget of one lease.
func (c *config) releaseTimeout() time.Duration { return c.lease / 4 }

// Owner returns the owner name this Client writes to its lock items.
func (c *Client) Owner() string { return c.cfg.owner }

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
// for all of the Client's goroutines to end. It is idempotent and safe to
// call concurrently; every call returns the first call's result: nil, or
// the releases that failed for another reason than a lost lock. Later
// calls of Acquire or TryAcquire return ErrClosed.
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
