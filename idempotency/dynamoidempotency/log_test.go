package dynamoidempotency_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/idempotency/dynamoidempotency"
)

// conflictOnce cancels the next TransactWriteItems, once armed, as
// DynamoDB does when it meets a concurrent transaction: nothing written.
type conflictOnce struct {
	dynamoidempotency.DynamoDBAPI
	armed atomic.Bool
}

func (c *conflictOnce) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, opts ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	if !c.armed.CompareAndSwap(true, false) {
		return c.DynamoDBAPI.TransactWriteItems(ctx, in, opts...)
	}
	return nil, &types.TransactionCanceledException{Message: aws.String("Transaction cancelled [TransactionConflict]"),
		CancellationReasons: []types.CancellationReason{{Code: aws.String("TransactionConflict")}}}
}

// A retried conflict, a replay and a mismatch log at Debug; a lost reply
// (an ambiguous commit) at Warn.
func TestLogger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var c *conflictOnce
	var l *lossy
	b := newDynamoBed(t, func(api dynamoidempotency.DynamoDBAPI) dynamoidempotency.DynamoDBAPI {
		l = &lossy{DynamoDBAPI: api}
		c = &conflictOnce{DynamoDBAPI: l}
		return c
	}, dynamoidempotency.WithLogger(log))
	c.armed.Store(true)
	if _, err := b.payOnce(ctx, "pay-1", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.payOnce(ctx, "pay-1", 100); err != nil {
		t.Fatal(err)
	}
	if _, err := b.payOnce(ctx, "pay-1", 200); !errors.Is(err, dynamoidempotency.ErrMismatch) {
		t.Fatalf("pay-1 with another amount: %v, want ErrMismatch", err)
	}
	l.armed.Store(true)
	if _, err := b.payOnce(ctx, "pay-2", 100); !errors.Is(err, dynamoidempotency.ErrAmbiguousCommit) {
		t.Fatalf("lost request: %v, want ErrAmbiguousCommit", err)
	}
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="idempotency: conflict; retrying" key=pay-1 attempt=1 delay=`,
		`level=DEBUG msg="idempotency: replayed" key=pay-1`,
		`level=DEBUG msg="idempotency: key reused with another request" key=pay-1 err=`,
		`level=WARN msg="idempotency: commit outcome unknown" key=pay-2 err=`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("logged %q, want %q", out, want)
		}
	}
}

// WithLogger(nil) is accepted, and the Store works.
func TestLoggerNil(t *testing.T) {
	t.Parallel()
	b := newDynamoBed(t, nil, dynamoidempotency.WithLogger(nil))
	if _, err := b.payOnce(context.Background(), "pay-1", 100); err != nil {
		t.Fatal(err)
	}
}
