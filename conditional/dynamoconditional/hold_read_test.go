package dynamoconditional_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// wantDynamoStatus checks Get's answer for resource against want and
// against the item as stored.
func wantDynamoStatus(t *testing.T, h *dynamoconditional.Holds, client *dynamodb.Client, table, resource string, want dynamoconditional.HoldStatus) {
	t.Helper()
	got, err := h.Get(context.Background(), resource)
	if err != nil {
		t.Fatalf("Get(%q): %v", resource, err)
	}
	want.Resource = resource
	if got.Resource != want.Resource || got.Holder != want.Holder || got.Confirmed != want.Confirmed || !got.Until.Equal(want.Until) {
		t.Fatalf("Get(%q) = %+v, want %+v", resource, got, want)
	}
	item := readDynamoHold(t, client, table, resource)
	switch {
	case got.Confirmed:
		if item.State != "confirmed" || item.Holder != got.Holder {
			t.Fatalf("Get(%q) = %+v, but the item is %+v", resource, got, item)
		}
	case got.Holder != "":
		if item.State != "held" || item.Holder != got.Holder || !item.Until.Equal(got.Until) {
			t.Fatalf("Get(%q) = %+v, but the item is %+v", resource, got, item)
		}
	}
}

func TestDynamoHoldsGetFreeHoldAny(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			clock := newHoldClock()
			h := newDynamoHolds(t, client, table, clock.now)
			all := []string{"e", "d", "c", "b", "a"}
			if err := h.Add(ctx, all...); err != nil {
				t.Fatal(err)
			}
			wantFree := func(want ...string) {
				t.Helper()
				free, err := h.Free(ctx, all)
				if err != nil || !slices.Equal(free, want) {
					t.Fatalf("Free = %v, %v; want %v in the order given", free, err, want)
				}
			}
			wantDynamoStatus(t, h, client, table, "a", dynamoconditional.HoldStatus{})
			wantFree(all...)

			until, err := h.Hold(ctx, "b", "alice", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			wantDynamoStatus(t, h, client, table, "b", dynamoconditional.HoldStatus{Holder: "alice", Until: until})
			wantFree("e", "d", "c", "a")
			if err := h.Confirm(ctx, "b", "alice"); err != nil {
				t.Fatal(err)
			}
			wantDynamoStatus(t, h, client, table, "b", dynamoconditional.HoldStatus{Holder: "alice", Confirmed: true})

			got, until, err := h.HoldAny(ctx, []string{"b", "c"}, "bob", time.Minute)
			if err != nil || got != "c" {
				t.Fatalf("HoldAny(b confirmed, c free) = %q, %v; want c", got, err)
			}
			wantDynamoStatus(t, h, client, table, "c", dynamoconditional.HoldStatus{Holder: "bob", Until: until})
			clock.advance(time.Second)
			again, until2, err := h.HoldAny(ctx, []string{"a", "c", "d", "e"}, "bob", time.Minute)
			if err != nil || again != "c" || !until2.After(until) {
				t.Fatalf("bob's second HoldAny = %q until %v, %v; want c again, after %v", again, until2, err, until)
			}
			wantFree("e", "d", "a")

			before := dynamoItems(t, client, table)
			_, _, err = h.HoldAny(ctx, []string{"c", "b"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny with none free", err, "c", dynamoconditional.ErrHeld)
			_, _, err = h.HoldAny(ctx, []string{"b"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny of a confirmed one", err, "b", dynamoconditional.ErrConfirmed)
			_, _, err = h.HoldAny(ctx, []string{"a", "zz"}, "carol", time.Minute)
			wantHoldErr(t, "HoldAny with an unknown one", err, "zz", dynamoconditional.ErrNotFound)
			if _, err := h.Get(ctx, "zz"); !errors.Is(err, dynamoconditional.ErrNotFound) {
				t.Fatalf("Get of an unknown resource: %v, want ErrNotFound", err)
			}
			if _, err := h.Free(ctx, []string{"a", "zz"}); !errors.Is(err, dynamoconditional.ErrNotFound) || !strings.Contains(err.Error(), `"zz"`) {
				t.Fatalf("Free with an unknown resource: %v, want ErrNotFound naming zz", err)
			}
			if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
				t.Fatalf("refused calls changed the table:\n%v\n%v", before, after)
			}

			// A hold past its end by this Holds' clock is free to Get,
			// Free and HoldAny, though the item still names its holder.
			clock.advance(time.Minute)
			wantDynamoStatus(t, h, client, table, "c", dynamoconditional.HoldStatus{})
			if r := readDynamoHold(t, client, table, "c"); r.State != "held" || r.Holder != "bob" {
				t.Fatalf("the ended hold's item: %+v, want still held by bob", r)
			}
			if free, err := h.Free(ctx, []string{"b", "c"}); err != nil || !slices.Equal(free, []string{"c"}) {
				t.Fatalf("Free after the end = %v, %v; want [c]", free, err)
			}
			got, until, err = h.HoldAny(ctx, []string{"b", "c"}, "carol", time.Minute)
			if err != nil || got != "c" {
				t.Fatalf("HoldAny after the end = %q, %v; want c", got, err)
			}
			wantDynamoStatus(t, h, client, table, "c", dynamoconditional.HoldStatus{Holder: "carol", Until: until})
		})
	}
}

// Rounds of M callers of HoldAny over N < M resources, one call each:
// exactly N win, each resource goes to one of them, the other M-N get
// ErrHeld, and Get and Free agree with the table.
func TestDynamoHoldAnyRace(t *testing.T) {
	t.Parallel()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			faults := &dynamoFaults{DynamoDBAPI: client}
			h := newDynamoHolds(t, faults, table, newHoldClock().now)
			const rounds, n, m = 2, 6, 24
			for round := range rounds {
				calls, reads := faults.calls.Load(), faults.reads.Load()
				owner := testenv.HoldAnyRound(t, h, fmt.Sprint("r", round), n, m)
				reads = faults.reads.Load() - reads
				t.Logf("round %d: %d callers, %d resources: %d reads (BatchGetItem), %d UpdateItems", round, m, n, reads, faults.calls.Load()-calls-reads)
				for s, who := range owner {
					wantDynamoStatus(t, h, client, table, s, dynamoconditional.HoldStatus{Holder: who, Until: readDynamoHold(t, client, table, s).Until})
				}
			}
		})
	}
}

// Bad input to Get, Free and HoldAny is ErrInvalid naming the argument,
// refused before any request, and changes nothing.
func TestDynamoHoldsReadBadInput(t *testing.T) {
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
	tooMany := make([]string, dynamoconditional.MaxResources+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprint(i)
	}
	holdAny := func(rs []string, who string, ttl time.Duration) func() error {
		return func() error { _, _, err := h.HoldAny(ctx, rs, who, ttl); return err }
	}
	free := func(rs []string) func() error {
		return func() error { _, err := h.Free(ctx, rs); return err }
	}
	for _, tc := range []struct {
		name, want string
		op         func() error
	}{
		{"get empty", "resource is empty", func() error { _, err := h.Get(ctx, ""); return err }},
		{"get long", "resource is 513 bytes", func() error { _, err := h.Get(ctx, long); return err }},
		{"get invalid UTF-8", "resource is not valid UTF-8", func() error { _, err := h.Get(ctx, "\xff"); return err }},
		{"free nothing", "resources is empty", free(nil)},
		{"free too many", "resources has 101 entries, more than 100", free(tooMany)},
		{"free duplicate", `resources has "b" twice`, free([]string{"b", "a", "b"})},
		{"free empty entry", "resources[1] is empty", free([]string{"b", ""})},
		{"hold any nothing", "resources is empty", holdAny(nil, "bob", time.Minute)},
		{"hold any too many", "more than 100", holdAny(tooMany, "bob", time.Minute)},
		{"hold any duplicate", `resources has "b" twice`, holdAny([]string{"b", "b"}, "bob", time.Minute)},
		{"hold any empty holder", "holder is empty", holdAny([]string{"b"}, "", time.Minute)},
		{"hold any zero ttl", "ttl 0s", holdAny([]string{"b"}, "bob", 0)},
		{"hold any sub-ms ttl", "ttl 500µs", holdAny([]string{"b"}, "bob", 500*time.Microsecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	if n := faults.calls.Load() - calls; n != 0 {
		t.Errorf("bad input sent %d requests, want 0", n)
	}
	if after := dynamoItems(t, client, table); !slices.Equal(after, before) {
		t.Fatalf("bad input changed the table:\n%v\n%v", before, after)
	}
}

// Free of MaxResources resources is one BatchGetItem; keys that DynamoDB
// leaves unprocessed are asked again, and the answer is the same.
func TestDynamoFreeReadsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, false)
	table := testenv.Table(t, client, false)
	faults := &dynamoFaults{DynamoDBAPI: client}
	h := newDynamoHolds(t, faults, table, newHoldClock().now)
	all := make([]string, dynamoconditional.MaxResources)
	for i := range all {
		all[i] = fmt.Sprintf("seat-%03d", i)
	}
	if err := h.Add(ctx, all...); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i, r := range all {
		if i%3 == 0 {
			if _, err := h.Hold(ctx, r, "alice", time.Minute); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want = append(want, r)
	}
	for _, every := range []int64{0, 1} {
		faults.unprocessEvery = every
		reads, unprocessed := faults.reads.Load(), faults.unprocessed.Load()
		free, err := h.Free(ctx, all)
		if err != nil || !slices.Equal(free, want) {
			t.Fatalf("unprocessed every %d calls: Free = %v, %v; want %v", every, free, err, want)
		}
		reads, unprocessed = faults.reads.Load()-reads, faults.unprocessed.Load()-unprocessed
		if wantReads := 1 + unprocessed; reads != wantReads || (every > 0) != (unprocessed > 0) {
			t.Fatalf("unprocessed every %d calls: %d reads, %d answers with keys unprocessed; want one read and one more per such answer", every, reads, unprocessed)
		}
	}
}
