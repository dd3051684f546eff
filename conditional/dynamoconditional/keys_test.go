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
	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

// WithKeyAttributes is checked as dynamocas and dynamoidempotency check
// it: before any I/O, names empty, equal or one of the type's own
// attributes are ErrInvalid naming them.
func TestKeyAttributesBadInput(t *testing.T) {
	t.Parallel()
	var c noIO
	keys := dynamoconditional.WithKeyAttributes
	for _, tc := range []struct {
		name, want string
		err        error
	}{
		{"empty partition", "partition", errOf(dynamoconditional.NewStock(c, "stock", keys("", "")))},
		{"same names", "sk", errOf(dynamoconditional.NewAccounts(c, "accounts", keys("sk", "sk")))},
		{"Stock's own attribute", dynamoconditional.QtyAttr, errOf(dynamoconditional.NewStock(c, "stock", keys(dynamoconditional.QtyAttr, "")))},
		{"Accounts' own attribute", dynamoconditional.BalanceAttr, errOf(dynamoconditional.NewAccounts(c, "accounts", keys("pk", dynamoconditional.BalanceAttr)))},
		{"Holds' own attribute", dynamoconditional.HolderAttr, errOf(dynamoconditional.NewHolds(c, "holds", keys(dynamoconditional.HolderAttr, "")))},
		{"NewFenced", "WithKeyAttributes does not apply to NewFenced", errOf(dynamoconditional.NewFenced("docs", "pk", "fence", keys("pk", "")))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, dynamoconditional.ErrInvalid) || !strings.Contains(tc.err.Error(), tc.want) {
				t.Fatalf("got %v; want ErrInvalid naming %q", tc.err, tc.want)
			}
		})
	}
}

// On a table whose partition key is not "pk", Stock, Accounts and Holds
// work once told its name; without it the server refuses the writes.
func TestKeyAttributesPartitionName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	table := testenv.Name("t")
	if err := services.CreateTableKeyed(ctx, client, table, "id"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.DeleteTable(context.Background(), client, table) })
	id := dynamoconditional.WithKeyAttributes("id", "")

	wrong, err := dynamoconditional.NewStock(client, table)
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := wrong.Put(ctx, "sku", 1); err == nil {
		t.Fatal("Put with the default key attribute on an id-keyed table: nil error")
	}
	s, err := dynamoconditional.NewStock(client, table, id)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Put(ctx, "sku", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, "sku", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, "sku", 1); !errors.Is(err, dynamoconditional.ErrSoldOut) {
		t.Fatalf("third take: %v; want ErrSoldOut", err)
	}
	a, err := dynamoconditional.NewAccounts(client, table, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Open(ctx, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 6); !errors.Is(err, dynamoconditional.ErrInsufficient) {
		t.Fatalf("overdraft: %v; want ErrInsufficient", err)
	}
	if got := dynamoBalance(t, a, "alice"); got != 5 {
		t.Fatalf("balance %d; want 5", got)
	}
	h, err := dynamoconditional.NewHolds(client, table, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Add(ctx, "seat"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat", "alice", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Hold(ctx, "seat", "bob", time.Minute); !errors.Is(err, dynamoconditional.ErrHeld) {
		t.Fatalf("second holder: %v; want ErrHeld", err)
	}
}

// On a table with a sort key, the items carry SortKeyValue, so another
// item with the same partition key value is neither read nor written.
func TestKeyAttributesSharedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	table := testenv.Table(t, client, true)
	other := map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "alice"}, "sk": &types.AttributeValueMemberS{Value: "profile"},
		dynamoconditional.BalanceAttr: &types.AttributeValueMemberN{Value: "1000"},
	}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: other}); err != nil {
		t.Fatal(err)
	}
	a, err := dynamoconditional.NewAccounts(client, table, dynamoconditional.WithKeyAttributes("pk", "sk"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Balance(ctx, "alice"); !errors.Is(err, dynamoconditional.ErrNotFound) {
		t.Fatalf("balance before Open: %v; want ErrNotFound (the other item is not the account)", err)
	}
	if err := a.Open(ctx, "alice", 5); err != nil {
		t.Fatal(err)
	}
	if err := a.Debit(ctx, "alice", 3); err != nil {
		t.Fatal(err)
	}
	if got := dynamoBalance(t, a, "alice"); got != 2 {
		t.Fatalf("balance %d; want 2", got)
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true), Key: map[string]types.AttributeValue{
		"pk": other["pk"], "sk": &types.AttributeValueMemberS{Value: dynamoconditional.SortKeyValue}}})
	if err != nil || out.Item == nil {
		t.Fatalf("the account's item under SortKeyValue: %v, %v", out, err)
	}
	out, err = client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true), Key: map[string]types.AttributeValue{
		"pk": other["pk"], "sk": other["sk"]}})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := out.Item[dynamoconditional.BalanceAttr].(*types.AttributeValueMemberN); b == nil || b.Value != "1000" {
		t.Fatalf("the other item changed: %v", out.Item)
	}
}
