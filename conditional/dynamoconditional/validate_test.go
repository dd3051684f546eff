package dynamoconditional_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Names that are not valid UTF-8 are refused before any I/O, with
// ErrInvalid: DynamoDB's JSON encoder would write each invalid byte as
// U+FFFD, so "sku-\xff" and "sku-\xfe" would address one item (a take of
// one key selling the other's units, a hold by one holder confirmed by
// another).
func TestInvalidUTF8NamesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			t.Run("stock", func(t *testing.T) {
				table := testenv.Table(t, client, false)
				s := newDynamoStock(t, client, table, 1)
				if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, dynamoconditional.ErrInvalid) {
					t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
				}
				if err := s.Take(ctx, "sku-\xfe", 3); !errors.Is(err, dynamoconditional.ErrInvalid) {
					t.Fatalf("Take of a non-UTF-8 key: %v, want ErrInvalid", err)
				}
				if items := dynamoItems(t, client, table); len(items) != 0 {
					t.Fatalf("items written: %v", items)
				}
			})
			t.Run("holds", func(t *testing.T) {
				table := testenv.Table(t, client, false)
				h := newDynamoHolds(t, client, table, newHoldClock().now)
				if err := h.Add(ctx, "seat"); err != nil {
					t.Fatal(err)
				}
				before := dynamoItems(t, client, table)
				if _, err := h.Hold(ctx, "seat", "holder-\xff", time.Minute); !errors.Is(err, dynamoconditional.ErrInvalid) {
					t.Fatalf("Hold by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if err := h.Confirm(ctx, "seat", "holder-\xfe"); !errors.Is(err, dynamoconditional.ErrInvalid) {
					t.Fatalf("Confirm by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if after := dynamoItems(t, client, table); !slices.Equal(before, after) {
					t.Fatalf("items changed: %v, then %v", before, after)
				}
			})
		})
	}
}

// A Fenced key that is not valid UTF-8 is refused before I/O: the
// SDK would send it as another item's key (each invalid byte as U+FFFD).
func TestDynamoFencedRefusesNonUTF8Key(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := dynamoClient(t, true)
	table := testenv.Table(t, client, false)
	f := newDynamoDocs(t, client, table)
	err := f.Update(ctx, client, dynamoDocKey("doc-\xff"), 7, dynamoBody("x"))
	if !errors.Is(err, dynamoconditional.ErrInvalid) || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("fenced Update of a non-UTF-8 key: %v, want ErrInvalid naming UTF-8", err)
	}
}

// A write whose ctx ended before the call sends nothing, and says so: it
// returns ctx's error, never ErrAmbiguousCommit.
func TestCancelledBeforeCallSendsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		if !errors.Is(err, context.Canceled) || errors.Is(err, dynamoconditional.ErrAmbiguousCommit) {
			t.Errorf("%s with a cancelled ctx: %v, want context.Canceled and not ErrAmbiguousCommit", what, err)
		}
	}
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			table := testenv.Table(t, client, false)
			s := newDynamoStock(t, client, table, 1)
			if err := s.Put(ctx, "sku", 5); err != nil {
				t.Fatal(err)
			}
			check(t, "Stock.Take", s.Take(cancelled, "sku", 1))
			check(t, "Stock.Put", s.Put(cancelled, "sku", 1))
			if got := dynamoAvailable(t, s, "sku"); got != 5 {
				t.Fatalf("available %d, want 5", got)
			}
		})
	}
}
