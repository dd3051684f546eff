package dynamoidempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/idempotency/dynamoidempotency"
	"github.com/nolock/nolock/internal/testenv"
	"github.com/nolock/nolock/observe"
)

// conflicting is a client whose transactions always meet a concurrent one.
type conflicting struct{ dynamoidempotency.DynamoDBAPI }

func (conflicting) TransactWriteItems(context.Context, *dynamodb.TransactWriteItemsInput, ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return nil, &types.TransactionCanceledException{Message: aws.String("conflict"),
		CancellationReasons: []types.CancellationReason{{Code: aws.String("TransactionConflict")}}}
}

// Each Do call's outcome reaches the observer: a first run, a replay, a
// mismatch, a failure with its error, and a wait for a duplicate that ran
// out.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	events := &testenv.Events{}
	b := newDynamoBed(t, nil, dynamoidempotency.WithObserver(observe.Func(events.Observe)))
	for _, amount := range []int64{10, 10, 20} {
		_, _ = b.store.Do(ctx, "alice", "pay-1", fingerprint("alice", "pay-1", amount), b.pay("pay-1", amount))
	}
	boom := errors.New("boom")
	_, _ = b.store.Do(ctx, "alice", "pay-2", nil, func(context.Context) ([]types.TransactWriteItem, []byte, error) { return nil, nil, boom })
	busy, err := dynamoidempotency.New(conflicting{b.client}, b.table,
		dynamoidempotency.WithWait(20*time.Millisecond), dynamoidempotency.WithObserver(observe.Func(events.Observe)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := busy.Do(ctx, "alice", "pay-3", nil, b.pay("pay-3", 1)); !errors.Is(err, dynamoidempotency.ErrInProgress) {
		t.Fatalf("Do meeting conflicts: %v, want ErrInProgress", err)
	}

	events.WantNames(t, map[string][]string{
		"pay-1": {dynamoidempotency.EventRan, dynamoidempotency.EventReplayed, dynamoidempotency.EventMismatch},
		"pay-2": {dynamoidempotency.EventFailed},
		"pay-3": {dynamoidempotency.EventInProgress},
	})
	if errs := events.Errs("pay-2", dynamoidempotency.EventFailed); len(errs) != 1 || !errors.Is(errs[0], boom) {
		t.Errorf("failed's error: %v, want boom", errs)
	}
	if got := events.Of("pay-3", dynamoidempotency.EventInProgress); len(got) != 1 || got[0].Duration < 20*time.Millisecond {
		t.Errorf("in_progress event: %+v, want a Duration of at least the wait", got)
	}
	for _, e := range events.Of("pay-1", dynamoidempotency.EventRan) {
		if e.Duration <= 0 {
			t.Errorf("ran's Duration %v, want > 0", e.Duration)
		}
	}
}

// A panicking observer changes no outcome.
func TestPanickingObserver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var boom testenv.Panicky
	b := newDynamoBed(t, nil, dynamoidempotency.WithObserver(observe.Func(boom.Observe)))
	first, err := b.payOnce(ctx, "pay-1", 10)
	if err != nil || first.Replayed {
		t.Fatalf("first: %+v, %v", first, err)
	}
	again, err := b.payOnce(ctx, "pay-1", 10)
	if err != nil || !again.Replayed {
		t.Fatalf("again: %+v, %v; want a replay", again, err)
	}
	b.check(initial-10, map[string]int64{"pay-1": 10})
	boom.Check(t, 1, 1)
}

// The events' names are what dashboards and alerts match: they never
// change.
func TestEventNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{dynamoidempotency.EventRan, "idempotency.ran"},
		{dynamoidempotency.EventReplayed, "idempotency.replayed"},
		{dynamoidempotency.EventMismatch, "idempotency.mismatch"},
		{dynamoidempotency.EventInProgress, "idempotency.in_progress"},
		{dynamoidempotency.EventFailed, "idempotency.failed"},
	} {
		if c.got != c.want {
			t.Errorf("event %q, want %q", c.got, c.want)
		}
	}
}
