package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// wantHoldErr checks that err is a *HoldError for resource wrapping want.
func wantHoldErr(t *testing.T, what string, err error, resource string, want error) {
	t.Helper()
	var he *dynamoconditional.HoldError
	if !errors.Is(err, want) || !errors.As(err, &he) || he.Resource != resource {
		t.Fatalf("%s: err = %v, want a HoldError for %q wrapping %v", what, err, resource, want)
	}
}

// holdClock is a clock the test moves by hand, safe for concurrent use.
type holdClock struct{ ms atomic.Int64 }

func newHoldClock() *holdClock {
	c := &holdClock{}
	c.ms.Store(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	return c
}

func (c *holdClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *holdClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func (c *holdClock) skewed(d time.Duration) func() time.Time {
	return func() time.Time { return c.now().Add(d) }
}

func newDynamoHolds(t *testing.T, client dynamoconditional.DynamoDBAPI, table string, clock func() time.Time) *dynamoconditional.Holds {
	t.Helper()
	h, err := dynamoconditional.NewHolds(client, table, dynamoconditional.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// dynamoHold is a resource's item as stored; Until is zero when absent.
type dynamoHold struct {
	State, Holder string
	Until         time.Time
}

func readDynamoHold(t *testing.T, client *dynamodb.Client, table, resource string) dynamoHold {
	t.Helper()
	item := dynamoItem(t, client, table, resource)
	if item == nil {
		t.Fatalf("no item %q", resource)
	}
	var r dynamoHold
	if v, ok := item[dynamoconditional.HoldStateAttr].(*types.AttributeValueMemberS); ok {
		r.State = v.Value
	}
	if v, ok := item[dynamoconditional.HolderAttr].(*types.AttributeValueMemberS); ok {
		r.Holder = v.Value
	}
	if v, ok := item[dynamoconditional.HoldUntilAttr].(*types.AttributeValueMemberN); ok {
		var ms int64
		if _, err := fmt.Sscan(v.Value, &ms); err != nil {
			t.Fatal(err)
		}
		r.Until = time.UnixMilli(ms)
	}
	return r
}

// dynamoItems returns every item of table as text, sorted, to compare
// before and after.
func dynamoItems(t *testing.T, client *dynamodb.Client, table string) []string {
	t.Helper()
	out, err := client.Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, item := range out.Items {
		var row []string
		for name, v := range item {
			switch v := v.(type) {
			case *types.AttributeValueMemberS:
				row = append(row, name+"="+v.Value)
			case *types.AttributeValueMemberN:
				row = append(row, name+"=#"+v.Value)
			default:
				row = append(row, fmt.Sprintf("%s=%T", name, v))
			}
		}
		slices.Sort(row)
		rows = append(rows, strings.Join(row, " "))
	}
	slices.Sort(rows)
	return rows
}

func TestDynamoHoldsLifecycle(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			faults := &dynamoFaults{DynamoDBAPI: client}
			clock := newHoldClock()
			h := newDynamoHolds(t, faults, table, clock.now)
			want := func(what, resource string, w dynamoHold) {
				t.Helper()
				if r := readDynamoHold(t, client, table, resource); r != w {
					t.Fatalf("%s: %s is %+v, want %+v", what, resource, r, w)
				}
			}
			if err := h.Add(ctx, "s1", "s2", "s1"); err != nil {
				t.Fatal(err)
			}
			want("after Add", "s1", dynamoHold{State: "free"})
			if n := dynamoCount(t, client, table); n != 2 {
				t.Fatalf("%d items after Add, want 2", n)
			}

			until, err := h.Hold(ctx, "s1", "alice", time.Minute)
			if err != nil {
				t.Fatalf("Hold of a free seat: %v", err)
			}
			if w := clock.now().Add(time.Minute); !until.Equal(w) {
				t.Fatalf("until %v, want the clock plus the TTL, %v", until, w)
			}
			want("after Hold", "s1", dynamoHold{"held", "alice", until})

			reads := faults.reads.Load()
			_, err = h.Hold(ctx, "s1", "bob", time.Minute)
			wantHoldErr(t, "Hold of a seat alice holds", err, "s1", dynamoconditional.ErrHeld)
			// moto returns the item with the failed condition; dynalite
			// does not, so the refusal's reason costs a read there.
			if got, w := faults.reads.Load()-reads, map[bool]int64{true: 0, false: 1}[server.tx]; got != w {
				t.Errorf("a refused Hold read %d times, want %d", got, w)
			}

			// A retried Hold by the holder succeeds and resets the end.
			clock.advance(30 * time.Second)
			again, err := h.Hold(ctx, "s1", "alice", time.Minute)
			if err != nil || !again.Equal(until.Add(30*time.Second)) {
				t.Fatalf("alice's retried Hold: %v, %v; want nil, %v", again, err, until.Add(30*time.Second))
			}
			want("after the retried Hold", "s1", dynamoHold{"held", "alice", again})
			if err := h.Confirm(ctx, "s1", "bob"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("bob confirms alice's hold: %v, want ErrNotHolder", err)
			}
			if err := h.Release(ctx, "s1", "bob"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("bob releases alice's hold: %v, want ErrNotHolder", err)
			}
			want("after bob's refused calls", "s1", dynamoHold{"held", "alice", again})

			// At its end, by the injected clock, the hold has expired: the
			// holder cannot confirm it, and anyone may take it over.
			clock.advance(time.Minute)
			if err := h.Confirm(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("Confirm of an expired hold: %v, want ErrNotHolder", err)
			}
			want("after the refused Confirm", "s1", dynamoHold{"held", "alice", again})
			bobs, err := h.Hold(ctx, "s1", "bob", time.Minute)
			if err != nil {
				t.Fatalf("bob takes over the expired hold: %v", err)
			}
			want("after the takeover", "s1", dynamoHold{"held", "bob", bobs})
			if err := h.Release(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("alice releases bob's hold: %v, want ErrNotHolder", err)
			}
			_, err = h.Hold(ctx, "s1", "alice", time.Minute)
			wantHoldErr(t, "alice after bob's takeover", err, "s1", dynamoconditional.ErrHeld)

			for i := 0; i < 2; i++ { // the second Confirm is a retry
				if err := h.Confirm(ctx, "s1", "bob"); err != nil {
					t.Fatalf("bob's Confirm #%d: %v", i+1, err)
				}
			}
			want("after Confirm", "s1", dynamoHold{State: "confirmed", Holder: "bob"})
			clock.advance(time.Hour)
			for _, who := range []string{"alice", "bob"} {
				_, err := h.Hold(ctx, "s1", who, time.Minute)
				wantHoldErr(t, who+" holds a confirmed seat", err, "s1", dynamoconditional.ErrConfirmed)
			}
			if err := h.Release(ctx, "s1", "bob"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("Release of a confirmed seat: %v, want ErrNotHolder", err)
			}
			if err := h.Confirm(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("alice confirms bob's seat: %v, want ErrNotHolder", err)
			}
			if err := h.Add(ctx, "s1"); err != nil {
				t.Fatal(err)
			}
			want("after Add of a confirmed seat", "s1", dynamoHold{State: "confirmed", Holder: "bob"})

			// Release is for the holder only, expired or not.
			if _, err := h.Hold(ctx, "s2", "alice", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := h.Release(ctx, "s2", "alice"); err != nil {
				t.Fatalf("Release: %v", err)
			}
			want("after Release", "s2", dynamoHold{State: "free"})
			if err := h.Release(ctx, "s2", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
				t.Fatalf("Release of a free seat: %v, want ErrNotHolder", err)
			}
			if _, err := h.Hold(ctx, "s2", "alice", time.Second); err != nil {
				t.Fatal(err)
			}
			clock.advance(2 * time.Second)
			if err := h.Release(ctx, "s2", "alice"); err != nil {
				t.Fatalf("Release of one's own expired hold: %v", err)
			}
			want("after the expired Release", "s2", dynamoHold{State: "free"})

			_, err = h.Hold(ctx, "nope", "alice", time.Minute)
			wantHoldErr(t, "Hold of an unknown seat", err, "nope", dynamoconditional.ErrNotFound)
			if err := h.Confirm(ctx, "nope", "alice"); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Confirm of an unknown seat: %v, want ErrNotFound", err)
			}
			if err := h.Release(ctx, "nope", "alice"); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Release of an unknown seat: %v, want ErrNotFound", err)
			}
			if n := dynamoCount(t, client, table); n != 2 {
				t.Fatalf("%d items, want 2: unknown resources must not be created", n)
			}
		})
	}
}

// Callers whose clocks disagree by an hour: the skew moves when a hold is
// seen as expired, by the hour, and never lets two holders both confirm.
func TestDynamoHoldsClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	clock := newHoldClock()
	h := newDynamoHolds(t, client, table, clock.now)
	ahead := newDynamoHolds(t, client, table, clock.skewed(time.Hour))
	behind := newDynamoHolds(t, client, table, clock.skewed(-time.Hour))
	if err := h.Add(ctx, "s1", "s2", "s3"); err != nil {
		t.Fatal(err)
	}

	// A clock an hour ahead sees alice's ten-minute hold as over.
	if _, err := h.Hold(ctx, "s1", "alice", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := ahead.Confirm(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
		t.Fatalf("alice confirms by a clock an hour ahead: %v, want ErrNotHolder", err)
	}
	if _, err := ahead.Hold(ctx, "s1", "bob", 10*time.Minute); err != nil {
		t.Fatalf("bob takes over by a clock an hour ahead: %v", err)
	}
	// alice's own clock still says she holds: refused all the same, since
	// every write is conditioned on the holder.
	if err := h.Confirm(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
		t.Fatalf("alice confirms after bob's takeover: %v, want ErrNotHolder", err)
	}
	_, err := h.Hold(ctx, "s1", "alice", time.Minute)
	wantHoldErr(t, "alice holds bob's seat", err, "s1", dynamoconditional.ErrHeld)
	if err := ahead.Confirm(ctx, "s1", "bob"); err != nil {
		t.Fatal(err)
	}
	if r := readDynamoHold(t, client, table, "s1"); r.State != "confirmed" || r.Holder != "bob" {
		t.Fatalf("s1 %+v, want confirmed by bob", r)
	}

	// A holder whose clock is an hour behind confirms its own hold after
	// its end by the others' clock, if nobody took it.
	if _, err := h.Hold(ctx, "s2", "carol", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Minute)
	if err := h.Confirm(ctx, "s2", "carol"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
		t.Fatalf("carol confirms 20 minutes after the end: %v, want ErrNotHolder", err)
	}
	if err := behind.Confirm(ctx, "s2", "carol"); err != nil {
		t.Fatalf("carol confirms by a clock an hour behind: %v, want nil", err)
	}
	// ... but not once someone took it.
	if _, err := h.Hold(ctx, "s3", "carol", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Minute)
	if _, err := h.Hold(ctx, "s3", "dave", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := behind.Confirm(ctx, "s3", "carol"); !errors.Is(err, dynamoconditional.ErrNotHolder) {
		t.Fatalf("carol confirms dave's seat by a clock an hour behind: %v, want ErrNotHolder", err)
	}
	if r := readDynamoHold(t, client, table, "s3"); r.State != "held" || r.Holder != "dave" {
		t.Fatalf("s3 %+v, want held by dave", r)
	}
}

func TestDynamoHoldAll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	clock := newHoldClock()
	h := newDynamoHolds(t, client, table, clock.now)
	if err := h.Add(ctx, "a", "b", "c", "d", "e", "f"); err != nil {
		t.Fatal(err)
	}
	want := []string{"c", "a", "b"}
	in := slices.Clone(want)
	until, err := h.HoldAll(ctx, in, "alice", time.Minute)
	if err != nil {
		t.Fatalf("HoldAll of free seats: %v", err)
	}
	if !slices.Equal(in, want) {
		t.Fatalf("HoldAll modified its argument: %v", in)
	}
	if !until.Equal(clock.now().Add(time.Minute)) {
		t.Fatalf("until %v, want %v", until, clock.now().Add(time.Minute))
	}
	for _, s := range want {
		if r := readDynamoHold(t, client, table, s); r != (dynamoHold{"held", "alice", until}) {
			t.Fatalf("%s: %+v, want held by alice until %v", s, r, until)
		}
	}
	if _, err := h.Hold(ctx, "d", "bob", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := dynamoItems(t, client, table)

	// One seat of carol's held by someone else: none is held.
	_, err = h.HoldAll(ctx, []string{"f", "d", "e"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAll with bob's seat", err, "d", dynamoconditional.ErrHeld)
	// Two held: the first in sorted order is named.
	_, err = h.HoldAll(ctx, []string{"f", "d", "b"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAll with alice's and bob's seats", err, "b", dynamoconditional.ErrHeld)
	_, err = h.HoldAll(ctx, []string{"e", "zz", "d", "a"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAll with an unknown seat", err, "zz", dynamoconditional.ErrNotFound)
	if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
		t.Fatalf("refused HoldAlls changed the table:\n%v\n%v", before, after)
	}
	for _, s := range []string{"e", "f"} {
		if r := readDynamoHold(t, client, table, s); r.State != "free" {
			t.Fatalf("%s: %+v after refused HoldAlls, want free", s, r)
		}
	}

	if err := h.Confirm(ctx, "c", "alice"); err != nil {
		t.Fatal(err)
	}
	before = dynamoItems(t, client, table)
	_, err = h.HoldAll(ctx, []string{"e", "c"}, "carol", time.Minute)
	wantHoldErr(t, "HoldAll with a confirmed seat", err, "c", dynamoconditional.ErrConfirmed)
	// alice re-holding a, b and her confirmed c: refused whole, a and b
	// keep their end.
	_, err = h.HoldAll(ctx, []string{"a", "b", "c"}, "alice", 2*time.Minute)
	wantHoldErr(t, "HoldAll with one's own confirmed seat", err, "c", dynamoconditional.ErrConfirmed)
	if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
		t.Fatalf("refused HoldAlls changed the table:\n%v\n%v", before, after)
	}

	// A retried HoldAll by the holder succeeds and extends.
	clock.advance(10 * time.Second)
	again, err := h.HoldAll(ctx, []string{"b", "a"}, "alice", time.Minute)
	if err != nil || !again.Equal(until.Add(10*time.Second)) {
		t.Fatalf("alice's retried HoldAll: %v, %v; want nil, %v", again, err, until.Add(10*time.Second))
	}
	// Once alice's and bob's holds expire, carol takes them all at once.
	clock.advance(time.Minute)
	if _, err := h.HoldAll(ctx, []string{"a", "b", "d", "e"}, "carol", time.Minute); err != nil {
		t.Fatalf("carol's HoldAll of expired and free seats: %v", err)
	}
	for _, s := range []string{"a", "b", "d", "e"} {
		if r := readDynamoHold(t, client, table, s); r.State != "held" || r.Holder != "carol" {
			t.Fatalf("%s: %+v, want held by carol", s, r)
		}
	}

	// dynalite has no transactions: HoldAll says so and changes nothing.
	plain := dynamoClient(t, false)
	ptable := testenv.Table(t, plain, false)
	ph := newDynamoHolds(t, plain, ptable, clock.now)
	if err := ph.Add(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := ph.HoldAll(ctx, []string{"a", "b"}, "alice", time.Minute); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("HoldAll without transactions: %v, want errors.ErrUnsupported", err)
	}
	for _, s := range []string{"a", "b"} {
		if r := readDynamoHold(t, plain, ptable, s); r.State != "free" {
			t.Fatalf("%s: %+v, want free", s, r)
		}
	}
}

// ConfirmItem and ReleaseItem in the caller's TransactWriteItems with an
// order item: both apply, or neither.
func TestDynamoHoldsItemsInTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	clock := newHoldClock()
	h := newDynamoHolds(t, client, table, clock.now)
	if err := h.Add(ctx, "s1", "s2", "s3"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if _, err := h.Hold(ctx, s, "alice", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	order := func(pk string) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: dynamoDocKey(pk)}}
	}
	item := func(it types.TransactWriteItem, err error) types.TransactWriteItem {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return it
	}
	run := func(items ...types.TransactWriteItem) error {
		_, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
		return err
	}

	if err := run(order("order-1"), item(h.ConfirmItem("s1", "bob"))); !dynamoconditional.ConditionFailedAt(err, 1) {
		t.Fatalf("bob's confirm with an order: %v, want a cancellation by the confirm (action 1)", err)
	}
	if dynamoItem(t, client, table, "order-1") != nil {
		t.Fatal("the order of a refused confirm was written")
	}
	if err := run(order("order-2"), item(h.ConfirmItem("s1", "alice"))); err != nil {
		t.Fatalf("alice's confirm with an order: %v", err)
	}
	if r := readDynamoHold(t, client, table, "s1"); r.State != "confirmed" || r.Holder != "alice" || dynamoItem(t, client, table, "order-2") == nil {
		t.Fatalf("s1 %+v, or no order-2: want both written", r)
	}
	if err := run(order("cancel-3"), item(h.ReleaseItem("s2", "alice"))); err != nil {
		t.Fatalf("alice's release with a cancellation: %v", err)
	}
	if r := readDynamoHold(t, client, table, "s2"); r.State != "free" {
		t.Fatalf("s2 %+v, want free", r)
	}
	// An item built after the hold's end, by the clock, is refused.
	clock.advance(time.Minute)
	if err := run(item(h.ConfirmItem("s3", "alice")), order("order-4")); !dynamoconditional.ConditionFailedAt(err, 0) {
		t.Fatalf("confirm of an expired hold with an order: %v, want a cancellation by the confirm (action 0)", err)
	}
	if r := readDynamoHold(t, client, table, "s3"); r.State != "held" || dynamoItem(t, client, table, "order-4") != nil {
		t.Fatalf("s3 %+v after a refused confirm, or order-4 written", r)
	}
}

// Bad input is ErrInvalid naming the argument, before any I/O, and
// changes nothing.
func TestDynamoHoldsBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	faults := &dynamoFaults{DynamoDBAPI: client}
	h := newDynamoHolds(t, faults, table, newHoldClock().now)
	if err := h.Add(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "a", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	before := dynamoItems(t, client, table)
	calls := faults.calls.Load()
	long := strings.Repeat("r", dynamoconditional.MaxKeyLen+1)
	many := make([]string, dynamoconditional.MaxHoldAll+1)
	for i := range many {
		many[i] = fmt.Sprintf("r%03d", i)
	}
	hold := func(r, who string, ttl time.Duration) func() error {
		return func() error { _, err := h.Hold(ctx, r, who, ttl); return err }
	}
	holdAll := func(rs []string, who string, ttl time.Duration) func() error {
		return func() error { _, err := h.HoldAll(ctx, rs, who, ttl); return err }
	}
	item := func(f func(string, string) (types.TransactWriteItem, error), r, who string) func() error {
		return func() error { _, err := f(r, who); return err }
	}
	for _, tc := range []struct {
		name, want string
		op         func() error
	}{
		{"add empty entry", "resources[1] is empty", func() error { return h.Add(ctx, "c", "") }},
		{"add long entry", "resources[0] is 513 bytes", func() error { return h.Add(ctx, long) }},
		{"add NUL entry", "resources[0] contains a NUL", func() error { return h.Add(ctx, "c\x00") }},
		{"hold empty resource", "resource is empty", hold("", "alice", time.Minute)},
		{"hold long resource", "resource is 513 bytes", hold(long, "alice", time.Minute)},
		{"hold NUL resource", "resource contains a NUL", hold("a\x00", "alice", time.Minute)},
		{"hold empty holder", "holder is empty", hold("b", "", time.Minute)},
		{"hold long holder", "holder is 513 bytes", hold("b", long, time.Minute)},
		{"hold zero ttl", "ttl 0s", hold("b", "bob", 0)},
		{"hold negative ttl", "ttl -1s", hold("b", "bob", -time.Second)},
		{"hold sub-ms ttl", "ttl 999µs is below 1ms", hold("b", "bob", 999*time.Microsecond)},
		{"hold all nothing", "resources is empty", holdAll(nil, "bob", time.Minute)},
		{"hold all too many", "resources has 101 entries, more than 100", holdAll(many, "bob", time.Minute)},
		{"hold all duplicate", `resources has "b" twice`, holdAll([]string{"b", "a", "b"}, "bob", time.Minute)},
		{"hold all empty entry", "resources[1] is empty", holdAll([]string{"b", ""}, "bob", time.Minute)},
		{"hold all empty holder", "holder is empty", holdAll([]string{"b"}, "", time.Minute)},
		{"hold all zero ttl", "ttl 0s", holdAll([]string{"b"}, "bob", 0)},
		{"confirm empty resource", "resource is empty", func() error { return h.Confirm(ctx, "", "alice") }},
		{"confirm empty holder", "holder is empty", func() error { return h.Confirm(ctx, "a", "") }},
		{"release empty holder", "holder is empty", func() error { return h.Release(ctx, "a", "") }},
		{"release long resource", "resource is 513 bytes", func() error { return h.Release(ctx, long, "alice") }},
		{"confirm item NUL holder", "holder contains a NUL", item(h.ConfirmItem, "a", "al\x00ice")},
		{"confirm item empty resource", "resource is empty", item(h.ConfirmItem, "", "alice")},
		{"release item empty holder", "holder is empty", item(h.ReleaseItem, "a", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := faults.calls.Load() - calls; n != 0 {
		t.Fatalf("bad input made %d calls to DynamoDB, want none", n)
	}
	if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
		t.Fatalf("bad input changed the table:\n%v\n%v", before, after)
	}
	for _, tc := range []struct {
		name   string
		client dynamoconditional.DynamoDBAPI
		table  string
		opts   []dynamoconditional.Option
		want   string
	}{
		{"nil client", nil, table, nil, "client is nil"},
		{"empty table", client, "", nil, "table is empty"},
		{"nil clock", client, table, []dynamoconditional.Option{dynamoconditional.WithClock(nil)}, "clock is nil"},
	} {
		if _, err := dynamoconditional.NewHolds(tc.client, tc.table, tc.opts...); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewHolds with %s: %v, want ErrInvalid naming %q", tc.name, err, tc.want)
		}
	}
}

// 32 holders each try to hold and confirm the same 5 seats, in random
// orders, until every seat is confirmed. The first time a holder gets a
// seat it stalls past its hold's end (the shared clock moves on by the
// TTL), so its Confirm is refused and others take the seat over, while the
// stalls also expire other holders' holds under them. Each seat must end
// confirmed by exactly one holder, and exactly 5 Confirms succeed.
func TestDynamoHoldsConcurrentConfirm(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
			defer cancel()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			clock := newHoldClock()
			h := newDynamoHolds(t, client, table, clock.now)
			seats := []string{"seat-0", "seat-1", "seat-2", "seat-3", "seat-4"}
			if err := h.Add(ctx, seats...); err != nil {
				t.Fatal(err)
			}
			const holders, ttl = 32, 10 * time.Second
			var mu sync.Mutex
			confirmedBy := map[string][]string{}
			var holds, confirms, expired, busy atomic.Int64
			dynamoRun(t, holders, func(w int) error {
				who := fmt.Sprintf("holder-%02d", w)
				for _, i := range rand.Perm(len(seats)) {
					seat, stalled := seats[i], false
				attempts:
					for {
						_, err := h.Hold(ctx, seat, who, ttl)
						switch {
						case errors.Is(err, dynamoconditional.ErrConfirmed):
							break attempts
						case errors.Is(err, dynamoconditional.ErrHeld):
							busy.Add(1)
							time.Sleep(time.Millisecond) // the holder's pause before it tries again
							continue
						case err != nil:
							return err
						}
						holds.Add(1)
						if !stalled {
							stalled = true
							clock.advance(ttl)
						}
						switch err := h.Confirm(ctx, seat, who); {
						case err == nil:
							confirms.Add(1)
							mu.Lock()
							confirmedBy[seat] = append(confirmedBy[seat], who)
							mu.Unlock()
							break attempts
						case errors.Is(err, dynamoconditional.ErrNotHolder):
							expired.Add(1)
						default:
							return err
						}
					}
				}
				return nil
			})
			t.Logf("%d holds granted, %d confirms, %d confirms refused as expired or taken over, %d holds refused as held",
				holds.Load(), confirms.Load(), expired.Load(), busy.Load())
			if confirms.Load() != int64(len(seats)) {
				t.Errorf("%d confirms succeeded, want %d", confirms.Load(), len(seats))
			}
			for _, seat := range seats {
				by := confirmedBy[seat]
				if len(by) != 1 {
					t.Errorf("%s confirmed by %v, want exactly one holder", seat, by)
					continue
				}
				if r := readDynamoHold(t, client, table, seat); r != (dynamoHold{State: "confirmed", Holder: by[0]}) {
					t.Errorf("%s is %+v, want confirmed by %s", seat, r, by[0])
				}
			}
			// Every seat's first holder stalled past its end.
			if expired.Load() < int64(len(seats)) || holds.Load() <= int64(len(seats)) {
				t.Errorf("%d expired confirms and %d holds: the stalls did not force takeovers", expired.Load(), holds.Load())
			}
		})
	}
}

// conflicts answers the next left requests of one operation itself, as
// DynamoDB does while a transaction is in progress on the item: 400 with a
// TransactionConflictException for an UpdateItem, or a
// TransactionCanceledException whose first reason is TransactionConflict
// for a TransactWriteItems of two actions. Other requests pass.
type conflicts struct {
	next       http.RoundTripper
	op         string
	left, seen atomic.Int64
}

func (c *conflicts) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.Header.Get("X-Amz-Target"), "."+c.op) {
		return c.next.RoundTrip(req)
	}
	c.seen.Add(1)
	if c.left.Add(-1) < 0 {
		return c.next.RoundTrip(req)
	}
	if req.Body != nil {
		req.Body.Close()
	}
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}`
	if c.op == "TransactWriteItems" {
		body = `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","Message":"Transaction cancelled [TransactionConflict, None]",` +
			`"CancellationReasons":[{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"},{"Code":"None"}]}`
	}
	return &http.Response{
		StatusCode: http.StatusBadRequest, Status: "400 Bad Request", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:    io.NopCloser(strings.NewReader(body)),
		Request: req, ContentLength: int64(len(body)),
	}, nil
}

// A write refused because a transaction is in progress on its item
// applied nothing, so it is retried with backoff; when that never ends,
// the caller gets ErrConflict and nothing changed.
func TestDynamoHoldsRetriesTransactionConflicts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	updates := &conflicts{op: "UpdateItem"}
	transactions := &conflicts{op: "TransactWriteItems"}
	client := dynamoClientVia(t, true, func(next http.RoundTripper) http.RoundTripper {
		transactions.next = next
		updates.next = transactions
		return updates
	})
	table := testenv.Table(t, client, false)
	h := newDynamoHolds(t, client, table, newHoldClock().now)
	if err := h.Add(ctx, "s1", "s2", "s3"); err != nil {
		t.Fatal(err)
	}

	updates.left.Store(2)
	updates.seen.Store(0)
	if _, err := h.Hold(ctx, "s1", "alice", time.Minute); err != nil {
		t.Fatalf("Hold after two conflicts: %v", err)
	}
	if n := updates.seen.Load(); n != 3 {
		t.Fatalf("Hold sent %d times, want 3", n)
	}
	transactions.left.Store(2)
	if _, err := h.HoldAll(ctx, []string{"s2", "s3"}, "alice", time.Minute); err != nil {
		t.Fatalf("HoldAll after two conflicts: %v", err)
	}
	if n := transactions.seen.Load(); n != 3 {
		t.Fatalf("HoldAll sent %d times, want 3", n)
	}
	before := dynamoItems(t, client, table)

	transactions.left.Store(1 << 40)
	if _, err := h.HoldAll(ctx, []string{"s2", "s3"}, "bob", time.Minute); !errors.Is(err, dynamoconditional.ErrConflict) {
		t.Fatalf("HoldAll under endless conflicts: %v, want ErrConflict", err)
	}
	updates.left.Store(1 << 40)
	if err := h.Confirm(ctx, "s1", "alice"); !errors.Is(err, dynamoconditional.ErrConflict) {
		t.Fatalf("Confirm under endless conflicts: %v, want ErrConflict", err)
	}
	updates.left.Store(0)
	if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
		t.Fatalf("writes that met conflicts changed the table:\n%v\n%v", before, after)
	}
}
