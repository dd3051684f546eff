package dynamolock

import (
	"context"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/internal/ddbarg"
	"github.com/nolock/nolock/internal/errfmt"
	"github.com/nolock/nolock/internal/lockcore"
	"github.com/nolock/nolock/internal/option"
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

// DefaultLease is the lease of a lock without a heartbeat, the Java lock
// client's default.
const DefaultLease = lockcore.DefaultLease

// Limits checked before any I/O.
const (
	MaxKeyLen     = 2048       // bytes of a partition key value (DynamoDB's limit)
	MaxSortKeyLen = 1024       // bytes of a sort key value (DynamoDB's limit)
	MaxDataLen    = 350 * 1024 // bytes of a data payload, leaving room in DynamoDB's 400 KB item
	maxPending    = 32         // RVNs of writes with unknown outcome a lock remembers
	// maxHeartbeats bounds the heartbeat calls a Client has in flight at
	// once: the connections the SDK's default HTTP client keeps open per
	// host. A call beyond them opens a connection of its own and closes
	// it after, which costs a server short of CPU more than the call.
	// Below it the lock core keeps a bound that follows the server's round
	// trips, starting at 8.
	maxHeartbeats = 10
)

// config is a Client's settings after its options.
type config struct {
	lockcore.Settings
	pkName, skName string
	fencing        bool
}

// Option configures a Client: WithKeyAttributes, WithLease,
// WithHeartbeat, WithPoll, WithExpiryWarning, WithOwner, WithLogger,
// WithObserver, WithClock, WithoutFencing. Options are applied in order,
// then validated together by New.
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
func WithLease(d time.Duration) Option { return func(c *config) { c.Lease = d } }

// WithHeartbeat sets how often a held lock writes a new record version
// number. It must be positive and at most half the lease; the default is a
// quarter of the lease.
func WithHeartbeat(d time.Duration) Option {
	return func(c *config) { c.Heartbeat, c.Set.Heartbeat = d, true }
}

// WithPoll sets how often a waiting Acquire reads the lock item (each wait
// is jittered down to half of it); it must be positive. It bounds how late a waiter notices a
// release or an expired lease: a dead holder's lock is taken over at most
// one lease plus one poll after its last heartbeat. Default: a second, or
// a quarter of the lease if that is shorter; at most the lease.
func WithPoll(d time.Duration) Option { return func(c *config) { c.Poll, c.Set.Poll = d, true } }

// WithExpiryWarning sets the margin of (*Lock).Expiring: it is closed when
// less than margin of the lock's local validity (or of its maximum hold)
// is left. It must be at least 0 and less than the lease minus the
// heartbeat, so it stays silent while heartbeats succeed; the default is a
// quarter of the lease.
func WithExpiryWarning(margin time.Duration) Option {
	return func(c *config) { c.Warn, c.Set.Warn = margin, true }
}

// WithOwner sets the owner name written to the lock items, for people and
// tools reading the table (it plays no part in ownership, which the record
// version number decides). The default is the host name, a dash and a
// random UUID, as AWS's Java lock client names its owners; an explicit
// name must not be empty.
func WithOwner(name string) Option { return func(c *config) { c.Owner, c.Set.Owner = name, true } }

// WithLogger sets the logger (nil, the default, discards). The Client logs
// retries at debug level and lost locks at warn level.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.Logger = l } }

// WithObserver reports the Client's events (EventAcquired,
// EventNotAcquired, EventContended, EventTakeover, EventRenewed,
// EventRenewFailed, EventExpiring, EventLost, EventReleased,
// EventNotReleased: their fields are in their docs) to o (nil: none).
// Acquire, TryAcquire and a Lock's Release (and Close) are calls
// (CallAcquire, CallTryAcquire, CallRelease): Start, End with the
// outcome, and the call's events between, on the calling goroutine. The
// other events (a lock's heartbeats, its expiry and loss, the releases
// of Close) reach o on a goroutine of the Client's, in order, never
// blocking a heartbeat; Close waits until o has had them all.
func WithObserver(o observe.Observer) Option {
	return func(c *config) { c.Observer = observe.Guard(o) }
}

// WithClock replaces time.Now as the Client's clock. Only differences of
// its readings are used (time.Now's carry a monotonic reading, so a wall
// clock step changes nothing); waiting still uses real timers. For tests.
func WithClock(now func() time.Time) Option { return func(c *config) { c.Now = now } }

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
	api   DynamoDBAPI
	table string
	cfg   config
	k     *lockcore.Keeper
	seen  *sightings
}

// New returns a Client for table. Options are validated before any I/O:
// invalid settings return an error wrapping ErrInvalid that names them.
// New does not contact DynamoDB.
func New(client DynamoDBAPI, table string, opts ...Option) (*Client, error) {
	cfg := config{Settings: lockcore.Defaults(), pkName: "key", fencing: true}
	if err := option.Apply(opts, func(o Option) { o(&cfg) }); err != nil {
		return nil, errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := cfg.validate(client, table); err != nil {
		return nil, err
	}
	c := &Client{api: client, table: table, cfg: cfg, seen: newSightings(defaultSightings)}
	c.k = lockcore.NewKeeper(lockcore.Config{
		Settings: cfg.Settings, WaitRenewal: true, MaxCalls: maxHeartbeats,
		Prefix: "dynamolock", Renewal: "heartbeat", Calls: "DynamoDB calls", Store: "DynamoDB",
		Events: lockcore.EventsOf("dynamolock"),
		Closed: ErrClosed, Released: ErrReleased, LockLost: ErrLockLost, NotAcquired: ErrNotAcquired,
	}, backend{c})
	return c, nil
}

func (c *config) validate(client DynamoDBAPI, table string) error {
	if ddbarg.NilClient(client) {
		return invalid("client is nil")
	}
	if err := ddbarg.Table("table", table); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := ddbarg.KeyAttributes(c.pkName, c.skName, OwnerAttr, RVNAttr, LeaseAttr, ReleasedAttr, DataAttr, TokenAttr); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := c.Check(); err != nil {
		return errfmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// Owner returns the owner name this Client writes to its lock items.
func (c *Client) Owner() string { return c.cfg.Owner }

// Close releases every lock the Client still holds (each as by
// (*Lock).Close), makes blocked Acquire calls return ErrClosed, and waits
// for all of the Client's goroutines to end. It is idempotent and safe to
// call concurrently; every call returns the first call's result: nil, or
// the releases that failed for another reason than a lost lock. Later
// calls of Acquire or TryAcquire return ErrClosed.
func (c *Client) Close() error { return c.k.Close(nil) }
