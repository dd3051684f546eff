package dynamoconditional_test

// The example is a whole program: DynamoDB comes from exampleDynamoDB (a
// stand-in for your own client and table). It has no Output comment, so go
// test only compiles it; TestExamples runs it against the test services and
// checks what it prints.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/internal/testenv"
)

// Each take is is one conditional write, never below zero.
func ExampleStock_Take() {
	ctx := context.Background()
	ddb, table := exampleDynamoDB() // your client, and a table whose string hash key is "pk"
	stock, err := dynamoconditional.NewStock(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	if err := stock.Put(ctx, "sku-42", 3); err != nil {
		log.Fatal(err)
	}
	fmt.Println("first:", stock.Take(ctx, "sku-42", 2))
	err = stock.Take(ctx, "sku-42", 2)
	fmt.Println("second sold out:", errors.Is(err, dynamoconditional.ErrSoldOut))
	left, _ := stock.Available(ctx, "sku-42")
	fmt.Println("left:", left)
}

// TestExamples runs each Example against the test services, on a fresh
// DynamoDB table.
func TestExamples(t *testing.T) {
	for _, ex := range []struct {
		name string
		run  func()
		want string
	}{
		{"Stock_Take", ExampleStock_Take, "first: <nil>\nsecond sold out: true\nleft: 1\n"},
	} {
		t.Run(ex.name, func(t *testing.T) {
			exampleDynamoDB = func() (*dynamodb.Client, string) {
				ddb := testenv.DynamoDB(t)
				return ddb, testenv.Table(t, ddb, false)
			}
			if got := testenv.Printed(t, ex.run); got != ex.want {
				t.Errorf("printed\n%s\nwant\n%s", got, ex.want)
			}
		})
	}
}

// exampleDynamoDB returns the example's client and a table; TestExamples
// sets it for each example.
var exampleDynamoDB func() (*dynamodb.Client, string)
