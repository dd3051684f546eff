package dynamoconditional_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// ApplyUpdate and ApplyPut fence requests the caller builds: a put creates
// the item with its token, an update of any expression (here ADD) applies
// for an equal or greater token and stores it, and a lower token's update
// or put is refused with nothing written.
func TestDynamoFencedApplyRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDB(t)
	table := testenv.Table(t, client, false)
	f, err := dynamoconditional.NewFenced(table, "pk", "fence")
	if err != nil {
		t.Fatal(err)
	}
	put := func(token int64, body string) error {
		in := &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "counter"}, "body": &types.AttributeValueMemberS{Value: body}}}
		if err := f.ApplyPut(in, token); err != nil {
			t.Fatal(err)
		}
		_, err := client.PutItem(ctx, in)
		return err
	}
	add := func(token int64) error {
		in := &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: dynamoDocKey("counter"),
			UpdateExpression:          aws.String("ADD #n :one"),
			ExpressionAttributeNames:  map[string]string{"#n": "n"},
			ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberN{Value: "1"}},
		}
		if err := f.ApplyUpdate(in, token); err != nil {
			t.Fatal(err)
		}
		_, err := client.UpdateItem(ctx, in)
		return err
	}
	var ccf *types.ConditionalCheckFailedException
	for _, step := range []struct {
		what    string
		err     error
		refused bool
	}{
		{"put with token 2 creates the item", put(2, "created"), false},
		{"add with token 2", add(2), false},
		{"add with token 3", add(3), false},
		{"add with stale token 2", add(2), true},
		{"put with stale token 1", put(1, "stale"), true},
		{"add with token 3 again", add(3), false},
	} {
		if step.refused != errors.As(step.err, &ccf) || !step.refused && step.err != nil {
			t.Fatalf("%s: %v; refused want %v", step.what, step.err, step.refused)
		}
	}
	item := dynamoItem(t, client, table, "counter")
	if n, fence, body := attrValue(item, "n"), attrValue(item, "fence"), attrValue(item, "body"); n != "3" || fence != "3" || body != "created" {
		t.Fatalf("item n=%s fence=%s body=%s; want n=3 fence=3 body=created", n, fence, body)
	}
}

// Bad requests are ErrInvalid before any I/O and leave the request as it
// was.
func TestDynamoFencedApplyBadInput(t *testing.T) {
	t.Parallel()
	f, err := dynamoconditional.NewFenced("docs", "pk", "fence")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		in    *dynamodb.UpdateItemInput
		token int64
	}{
		{"nil request", nil, 1},
		{"negative token", &dynamodb.UpdateItemInput{Key: dynamoDocKey("d")}, -1},
		{"other table", &dynamodb.UpdateItemInput{TableName: aws.String("other"), Key: dynamoDocKey("d")}, 1},
		{"no key attribute", &dynamodb.UpdateItemInput{Key: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "d"}}}, 1},
		{"placeholder name used", &dynamodb.UpdateItemInput{Key: dynamoDocKey("d"), ExpressionAttributeNames: map[string]string{"#nolockFence": "x"}}, 1},
		{"placeholder value used", &dynamodb.UpdateItemInput{Key: dynamoDocKey("d"), ExpressionAttributeValues: map[string]types.AttributeValue{":nolockToken": &types.AttributeValueMemberN{Value: "1"}}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before dynamodb.UpdateItemInput
			if tc.in != nil {
				before = *tc.in
			}
			if err := f.ApplyUpdate(tc.in, tc.token); !errors.Is(err, dynamoconditional.ErrInvalid) {
				t.Fatalf("ApplyUpdate: %v; want ErrInvalid", err)
			}
			if tc.in != nil && !reflect.DeepEqual(before, *tc.in) {
				t.Fatalf("request changed: %+v", *tc.in)
			}
		})
	}
	put := &dynamodb.PutItemInput{Item: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "d"}}}
	if err := f.ApplyPut(put, 1); !errors.Is(err, dynamoconditional.ErrInvalid) || put.Item["fence"] != nil {
		t.Fatalf("ApplyPut without the key attribute: %v, item %v; want ErrInvalid and no fence", err, put.Item)
	}
}

// attrValue is a string or number attribute's text ("" if absent).
func attrValue(item map[string]types.AttributeValue, name string) string {
	switch v := item[name].(type) {
	case *types.AttributeValueMemberS:
		return v.Value
	case *types.AttributeValueMemberN:
		return v.Value
	}
	return ""
}
