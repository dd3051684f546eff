package dynamolock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/internal/ddberr"
	"github.com/nolock/nolock/internal/testenv"
)

// While DynamoDB fails every call at once, TryAcquire and a bounded Acquire
// give up promptly (the try after an attempt round, the Acquire when its
// wait passes), with the DynamoDB error in the chain.
func TestUnreachableAcquireGivesUp(t *testing.T) {
	t.Parallel()
	server, table := newTable(t)
	api := &faulty{DynamoDBAPI: server}
	api.blackhole.Store(true)
	c := newClient(t, api, table)
	t.Cleanup(func() { api.blackhole.Store(false) }) // before c's Close releases what may have applied
	for _, tc := range []struct {
		name    string
		acquire func(ctx context.Context) (*dynamolock.Lock, error)
	}{
		{"TryAcquire", func(ctx context.Context) (*dynamolock.Lock, error) { return c.TryAcquire(ctx, "k") }},
		{"Acquire WithWait", func(ctx context.Context) (*dynamolock.Lock, error) {
			return c.Acquire(ctx, "k", dynamolock.WithWait(200*time.Millisecond))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(5*time.Second))
			defer cancel()
			start := time.Now()
			l, err := tc.acquire(ctx)
			took := time.Since(start)
			if err == nil {
				l.Close()
				t.Fatal("acquired while DynamoDB was unreachable")
			}
			if bound := testenv.Scale(time.Second); took > bound {
				t.Fatalf("returned after %v (%v); want well under %v", took, err, bound)
			}
			if !errors.Is(err, errInjected) {
				t.Fatalf("err %v; want the DynamoDB error in its chain", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err %v: the caller's context did not end", err)
			}
			t.Logf("gave up after %v: %v", took.Round(time.Millisecond), err)
		})
	}
	// Without a wait, Acquire keeps trying until its context ends, and then
	// says what DynamoDB last answered.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.Acquire(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errInjected) {
		t.Fatalf("Acquire until ctx ends: %v; want the context's error and the DynamoDB error", err)
	}
}

// refusing sends every call to the live server, or, while down is set, to
// a port where connections are refused: real dial errors, nothing sent.
type refusing struct {
	live, dead dynamolock.DynamoDBAPI
	down       atomic.Bool
	refused    atomic.Int64 // releases sent while down
}

func (r *refusing) api() dynamolock.DynamoDBAPI {
	if r.down.Load() {
		return r.dead
	}
	return r.live
}

func (r *refusing) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return r.api().GetItem(ctx, in, o...)
}

func (r *refusing) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	api := r.api()
	if api == r.dead && op(in) == "release" {
		r.refused.Add(1)
	}
	return api.UpdateItem(ctx, in, o...)
}

func (r *refusing) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return r.api().DeleteItem(ctx, in, o...)
}

// A refused connection sends nothing, so nothing can have applied: a
// TryAcquire that gives up leaves no release to do in the background, and
// a release that cannot connect returns its error after one attempt
// instead of retrying for a lease. The item of a lock whose release was
// not sent stays held.
func TestRefusedConnectionNotSent(t *testing.T) {
	t.Parallel()
	refused := testenv.RefusedEndpoint(t)
	server, table := newTable(t)
	api := &refusing{live: server, dead: clientFor(t, refused)}
	api.down.Store(true)
	c := newClient(t, api, table)
	if l, err := c.TryAcquire(context.Background(), "k"); err == nil {
		l.Close()
		t.Fatal("acquired while connections were refused")
	}
	c.Close()
	if n := api.refused.Load(); n != 0 {
		t.Fatalf("Client.Close after a TryAcquire that sent nothing sent %d releases; want none", n)
	}

	api.down.Store(false)
	c = newClient(t, api, table)
	l := mustAcquire(t, c, "k")
	api.down.Store(true)
	err := l.Close()
	if err == nil || errors.Is(err, dynamolock.ErrLockLost) {
		t.Fatalf("Close while connections were refused: %v; want the dial error", err)
	}
	if ddberr.Of(err) != ddberr.NotSent { // the dial's error, or a deadline that cut every attempt before a connection
		t.Fatalf("Close: %v; want an error that proves nothing was sent", err)
	}
	if n := api.refused.Load(); n != 1 {
		t.Fatalf("Close while connections were refused sent %d releases; want 1: a refused one changed nothing", n)
	}
	api.down.Store(false)
	if item := readItem(t, server, table, "k"); attrS(item, dynamolock.ReleasedAttr) != "" || attrS(item, dynamolock.OwnerAttr) != c.Owner() {
		t.Fatalf("item after a release that was not sent: %v; want still held", item)
	}
}

// Keys that are not valid UTF-8 are refused before any I/O: DynamoDB's JSON
// would replace the bad bytes with U+FFFD, making "job-\xff" and
// "job-\xfe" one lock.
func TestInvalidUTF8Refused(t *testing.T) {
	t.Parallel()
	api := &counting{} // no server behind: nothing may be called
	c, err := dynamolock.New(api, "locks")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cs, err := dynamolock.New(api, "locks", dynamolock.WithKeyAttributes("key", "sk"))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for _, tc := range []struct {
		name string
		try  func() error
	}{
		{"key", func() error { _, err := c.TryAcquire(context.Background(), "job-\xff"); return err }},
		{"key Acquire", func() error { _, err := c.Acquire(context.Background(), "job-\xfe"); return err }},
		{"sort key", func() error {
			_, err := cs.TryAcquire(context.Background(), "job", dynamolock.WithSortKey("s-\xff"))
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.try(); !errors.Is(err, dynamolock.ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
				t.Fatalf("err = %v; want ErrInvalid naming UTF-8", err)
			}
		})
	}
	if _, err := dynamolock.New(api, "locks", dynamolock.WithOwner("me-\xff")); !errors.Is(err, dynamolock.ErrInvalid) {
		t.Fatalf("owner with invalid UTF-8: %v; want ErrInvalid", err)
	}
	if n := api.total(); n != 0 {
		t.Fatalf("%d calls reached DynamoDB; invalid keys must be refused before any I/O", n)
	}
}
