package conditional_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nolock/nolock/conditional"
	"github.com/nolock/nolock/internal/testenv"
)

// TestInvalidUTF8NamesRefused: DynamoDB's JSON encoder writes each invalid
// byte as U+FFFD, so "sku-\xff" and "sku-\xfe" addressed one item and a
// take of one key sold the other's units; a hold by one holder was
// confirmed by another. Such names are refused before any I/O, on
// PostgreSQL too (which refused them only after the round trip, 22021).
func TestInvalidUTF8NamesRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		s := newStock(t, testenv.Postgres(t))
		if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, conditional.ErrInvalid) {
			t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
		}
	})
	for _, server := range dynamoServers {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := dynamoClient(t, server.tx)
			t.Run("stock", func(t *testing.T) {
				table := testenv.Table(t, client, false)
				s := newDynamoStock(t, client, table, 1)
				if err := s.Put(ctx, "sku-\xff", 3); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Put of a non-UTF-8 key: %v, want ErrInvalid", err)
				}
				if err := s.Take(ctx, "sku-\xfe", 3); !errors.Is(err, conditional.ErrInvalid) {
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
				if _, err := h.Hold(ctx, "seat", "holder-\xff", time.Minute); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Hold by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if err := h.Confirm(ctx, "seat", "holder-\xfe"); !errors.Is(err, conditional.ErrInvalid) {
					t.Fatalf("Confirm by a non-UTF-8 holder: %v, want ErrInvalid", err)
				}
				if after := dynamoItems(t, client, table); !slices.Equal(before, after) {
					t.Fatalf("items changed: %v, then %v", before, after)
				}
			})
		})
	}
}
