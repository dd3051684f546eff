package dynamoconditional_test

// The examples are whole programs: DynamoDB comes from the AWS SDK's
// default configuration and the table from DYNAMODB_TABLE (stand-ins for
// your own). Under go test, TestMain points AWS_ENDPOINT_URL_DYNAMODB at the
// test services and DYNAMODB_TABLE at a fresh table (see
// testenv.ExampleMain), so the examples run and their Output is checked.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
)

// Takes are conditional writes, never below zero; concurrent takes of a
// key are coalesced into one write until the Stock is closed.
func ExampleStock_Take() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // region, credentials, AWS_ENDPOINT_URL_DYNAMODB
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // a table whose string hash key is "pk"
	stock, err := dynamoconditional.NewStock(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	defer stock.Close() // concurrent takes of a key are coalesced until then
	if err := stock.Put(ctx, "sku-42", 3); err != nil {
		log.Fatal(err)
	}
	fmt.Println("first:", stock.Take(ctx, "sku-42", 2))
	err = stock.Take(ctx, "sku-42", 2)
	fmt.Println("second sold out:", errors.Is(err, dynamoconditional.ErrSoldOut))
	left, _ := stock.Available(ctx, "sku-42")
	fmt.Println("left:", left)
	// Output:
	// first: <nil>
	// second sold out: true
	// left: 1
}

// A debit the balance cannot cover is refused and changes nothing.
func ExampleAccounts_Debit() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	accounts, err := dynamoconditional.NewAccounts(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	if err := accounts.Open(ctx, "wallet-7", 100_00); err != nil { // cents
		log.Fatal(err)
	}
	fmt.Println("first:", accounts.Debit(ctx, "wallet-7", 70_00))
	err = accounts.Debit(ctx, "wallet-7", 70_00)
	fmt.Println("second refused:", errors.Is(err, dynamoconditional.ErrInsufficient))
	balance, _ := accounts.Balance(ctx, "wallet-7")
	fmt.Println("balance:", balance)
	// Output:
	// first: <nil>
	// second refused: true
	// balance: 3000
}

// A seat held by one buyer cannot be held by another until the hold
// expires or is released; a released seat can be held again, and the
// holder confirms it.
func ExampleHolds_Hold() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	seats, err := dynamoconditional.NewHolds(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	if err := seats.Add(ctx, "show-9/12A"); err != nil {
		log.Fatal(err)
	}
	_, err = seats.Hold(ctx, "show-9/12A", "alice", 10*time.Minute)
	fmt.Println("alice holds:", err == nil)
	_, err = seats.Hold(ctx, "show-9/12A", "bob", 10*time.Minute)
	fmt.Println("bob refused:", errors.Is(err, dynamoconditional.ErrHeld))
	fmt.Println("alice releases:", seats.Release(ctx, "show-9/12A", "alice"))
	_, err = seats.Hold(ctx, "show-9/12A", "bob", 10*time.Minute)
	fmt.Println("bob holds:", err == nil)
	fmt.Println("bob confirms:", seats.Confirm(ctx, "show-9/12A", "bob"))
	// Output:
	// alice holds: true
	// bob refused: true
	// alice releases: <nil>
	// bob holds: true
	// bob confirms: <nil>
}

// A leader paused past its lease wakes up with an old token: its write to
// your item is refused because a newer leader wrote it.
func ExampleFenced_Update() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "manifest/events"}}
	if _, err := ddb.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key}); err != nil {
		log.Fatal(err)
	}
	manifest, _ := dynamoconditional.NewFenced(table, "pk", "fence")
	files := func(f string) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"files": &types.AttributeValueMemberS{Value: f}}
	}
	fmt.Println("new leader (token 8):", manifest.Update(ctx, ddb, key, 8, files("seg-0102")))
	err = manifest.Update(ctx, ddb, key, 7, files("seg-0101"))
	fmt.Println("old leader (token 7) fenced:", errors.Is(err, dynamoconditional.ErrFenced))
	// Output:
	// new leader (token 8): <nil>
	// old leader (token 7) fenced: true
}
