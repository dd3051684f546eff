package dynamoconditional_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// Each Debit reports granted, refused or failed, with the account and the
// amount; credits report nothing.
func TestAccountsObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	events := &testenv.Events{}
	a, err := dynamoconditional.NewAccounts(client, testenv.Table(t, client, false), dynamoconditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "alice", 10); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 7); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 7); !errors.Is(err, dynamoconditional.ErrInsufficient) {
		t.Fatalf("debit past the balance: %v, want ErrInsufficient", err)
	}
	if err := a.Credit(ctx, "alice", 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "bob", 1); !errors.Is(err, dynamoconditional.ErrNotFound) {
		t.Fatalf("debit of no account: %v, want ErrNotFound", err)
	}
	events.WantNames(t, map[string][]string{
		"alice": {dynamoconditional.EventGranted, dynamoconditional.EventRefused},
		"bob":   {dynamoconditional.EventFailed},
	})
	for _, e := range events.Of("alice", dynamoconditional.EventGranted) {
		if e.N != 7 {
			t.Errorf("granted's N %d, want 7", e.N)
		}
	}
	if errs := events.Errs("alice", dynamoconditional.EventRefused); len(errs) != 1 || !errors.Is(errs[0], dynamoconditional.ErrInsufficient) {
		t.Errorf("refused's error: %v, want ErrInsufficient", errs)
	}
}

// Each Hold, HoldAll, Confirm and Release reports its outcome with the
// resource (HoldAll: the sorted resources joined by ","), N and Duration.
func TestHoldsObserver(t *testing.T) {
	t.Parallel()
	client := testenv.DynamoDBTx(t)
	events := &testenv.Events{}
	h, err := dynamoconditional.NewHolds(client, testenv.Table(t, client, false), dynamoconditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	events.HoldsEvents(t, h)
}

// Each fenced Update reports its outcome with the key (and sort key) and
// the token.
func TestFencedObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	table := testenv.Table(t, client, true)
	events := &testenv.Events{}
	f, err := dynamoconditional.NewFenced(table, "pk", "fence", dynamoconditional.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	key := func(pk string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "sk": &types.AttributeValueMemberS{Value: "v1"}}
	}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("doc")}); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, client, key("doc"), 5, dynamoBody("v5")); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, client, key("doc"), 4, dynamoBody("v4")); !errors.Is(err, dynamoconditional.ErrFenced) {
		t.Fatalf("stale token: %v, want ErrFenced", err)
	}
	if err := f.Update(ctx, client, key("none"), 5, nil); !errors.Is(err, dynamoconditional.ErrNotFound) {
		t.Fatalf("no item: %v, want ErrNotFound", err)
	}
	events.WantNames(t, map[string][]string{
		"doc/v1":  {dynamoconditional.EventWritten, dynamoconditional.EventFenced},
		"none/v1": {dynamoconditional.EventFailed},
	})
	if got := events.Of("doc/v1", dynamoconditional.EventFenced); len(got) != 1 || got[0].Token != 4 || !errors.Is(got[0].Err, dynamoconditional.ErrFenced) {
		t.Errorf("fenced event: %+v, want Token 4 and ErrFenced", got)
	}
	if got := events.Of("doc/v1", dynamoconditional.EventWritten); len(got) != 1 || got[0].Token != 5 || got[0].Duration <= 0 {
		t.Errorf("written event: %+v, want Token 5 and a Duration", got)
	}
}

// A panicking observer changes no outcome.
func TestPanickingObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	table := testenv.Table(t, client, false)
	var panicky testenv.Panicky
	boom := dynamoconditional.WithObserver(observe.Func(panicky.Observe))
	a, err := dynamoconditional.NewAccounts(client, table, boom)
	if err != nil {
		t.Fatal(err)
	}
	h, err := dynamoconditional.NewHolds(client, table, boom)
	if err != nil {
		t.Fatal(err)
	}
	f, err := dynamoconditional.NewFenced(table, "pk", "fence", boom)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dynamoconditional.NewStock(client, table, boom); err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 1); !errors.Is(err, dynamoconditional.ErrInsufficient) {
		t.Fatalf("debit of an empty account: %v, want ErrInsufficient", err)
	}
	if err := h.Add(ctx, "seat"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat", "bob", time.Minute); !errors.Is(err, dynamoconditional.ErrHeld) {
		t.Fatalf("second holder: %v, want ErrHeld", err)
	}
	if err := f.Update(ctx, client, dynamoDocKey("alice"), 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Update(ctx, client, dynamoDocKey("alice"), 2, nil); !errors.Is(err, dynamoconditional.ErrFenced) {
		t.Fatalf("stale token: %v, want ErrFenced", err)
	}
	panicky.Check(t, 3, 3) // of 3 values (and one quiet Stock)
}

// The new constructors refuse a nil option, naming it.
func TestNilObserverOption(t *testing.T) {
	t.Parallel()
	client := testenv.DynamoDB(t)
	obs := dynamoconditional.WithObserver(nil)
	for name, call := range map[string]func() error{
		"NewAccounts": func() error { _, err := dynamoconditional.NewAccounts(client, "t", obs, nil); return err },
		"NewFenced":   func() error { _, err := dynamoconditional.NewFenced("t", "pk", "fence", obs, nil); return err },
		"NewFenced typed nil": func() error {
			_, err := dynamoconditional.NewFenced("t", "pk", "fence", obs, dynamoconditional.Option(nil))
			return err
		},
	} {
		if err := call(); !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), "option 1 is nil") {
			t.Errorf("%s with a nil option: %v, want ErrInvalid naming option 1", name, err)
		}
	}
}

// noIO is a client whose every call panics (its DynamoDBAPI is nil): the
// constructors judge their options before any I/O.
type noIO struct{ dynamoconditional.DynamoDBAPI }

// A setter given to a constructor it does not apply to is refused with
// ErrInvalid naming the setter and the constructor, before any I/O; the
// setters that apply are taken.
func TestOptionsApplyOnlyWhereListed(t *testing.T) {
	t.Parallel()
	var c noIO
	obs := dynamoconditional.WithObserver(nil)
	clock := dynamoconditional.WithClock(time.Now)
	for _, tc := range []struct {
		name, want string // want: "" to accept, else the setter and constructor named
		err        error
	}{
		{"NewAccounts with WithBuckets", "WithBuckets does not apply to NewAccounts", errOf(dynamoconditional.NewAccounts(c, "t", obs, dynamoconditional.WithBuckets(2)))},
		{"NewStock with WithClock", "WithClock does not apply to NewStock", errOf(dynamoconditional.NewStock(c, "t", clock))},
		{"NewHolds with WithMaxBatch", "WithMaxBatch does not apply to NewHolds", errOf(dynamoconditional.NewHolds(c, "t", dynamoconditional.WithMaxBatch(2)))},
		{"NewFenced with WithLogger", "WithLogger does not apply to NewFenced", errOf(dynamoconditional.NewFenced("t", "pk", "fence", dynamoconditional.WithLogger(nil)))},
		{"NewHolds with its setters", "", errOf(dynamoconditional.NewHolds(c, "holds", obs, clock, dynamoconditional.WithLogger(nil)))},
		{"NewStock with its setters", "", errOf(dynamoconditional.NewStock(c, "stock", obs, dynamoconditional.WithBuckets(2), dynamoconditional.WithCoalescing(false)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			switch {
			case tc.want == "" && tc.err != nil:
				t.Fatalf("refused: %v", tc.err)
			case tc.want != "" && (!errors.Is(tc.err, dynamoconditional.ErrInvalid) || !strings.Contains(tc.err.Error(), tc.want)):
				t.Fatalf("got %v; want ErrInvalid naming %q", tc.err, tc.want)
			}
		})
	}
}

// errOf drops a constructor's value, keeping its error.
func errOf[T any](_ T, err error) error { return err }

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{dynamoconditional.EventGranted, "conditional.granted"},
		{dynamoconditional.EventRefused, "conditional.refused"},
		{dynamoconditional.EventFailed, "conditional.failed"},
		{dynamoconditional.EventBatch, "conditional.batch"},
		{dynamoconditional.EventHeld, "conditional.held"},
		{dynamoconditional.EventConfirmed, "conditional.confirmed"},
		{dynamoconditional.EventReleased, "conditional.released"},
		{dynamoconditional.EventWritten, "conditional.written"},
		{dynamoconditional.EventFenced, "conditional.fenced"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
