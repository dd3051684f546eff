package dynamoidempotency_test

// The example is a whole program: DynamoDB comes from the AWS SDK's
// default configuration and the table from DYNAMODB_TABLE (stand-ins for
// your own). Under go test, TestMain points AWS_ENDPOINT_URL_DYNAMODB at the
// test server with transactions and DYNAMODB_TABLE at a fresh table (see
// testenv.ExampleMain), so the example runs and its Output is checked.

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/nolock/nolock/idempotency/dynamoidempotency"
)

// A client retries a payment with the same key: the charge is written in
// the same transaction as the key's record, once, and the retry replays
// the stored result.
func ExampleStore_Do() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx) // region, credentials, AWS_ENDPOINT_URL_DYNAMODB
	if err != nil {
		log.Fatal(err)
	}
	ddb, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE") // string hash key "pk"
	store, err := dynamoidempotency.New(ddb, table)
	if err != nil {
		log.Fatal(err)
	}
	key := uuid.NewString() // the client's Idempotency-Key, sent again with its retry
	charge := func(ctx context.Context) ([]types.TransactWriteItem, []byte, error) {
		put := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: "charge/" + key},
			"cents": &types.AttributeValueMemberN{Value: "1500"},
		}}}
		return []types.TransactWriteItem{put}, []byte("charged 1500"), nil
	}
	fp := dynamoidempotency.Fingerprint([]byte("alice"), []byte("1500"))
	for range 2 { // the second call is the client's retry
		res, err := store.Do(ctx, "payments", key, fp, charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
	}
	// Output:
	// charged 1500, replayed: false
	// charged 1500, replayed: true
}

// The effect as DynamoDB writes: a conditional debit of the wallet and the
// ledger item, sent with the key's record in one TransactWriteItems.
func ExampleWithRetention() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	s := func(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }
	n := func(v string) types.AttributeValue { return &types.AttributeValueMemberN{Value: v} }
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table),
		Item: map[string]types.AttributeValue{"pk": s("wallet/alice"), "balance": n("1000")}}); err != nil {
		log.Fatal(err)
	}
	payer, key, fp := "alice", "pay-7", dynamoidempotency.Fingerprint([]byte("alice"), []byte("300"))
	debitWallet := types.TransactWriteItem{Update: &types.Update{TableName: aws.String(table),
		Key:                       map[string]types.AttributeValue{"pk": s("wallet/alice")},
		UpdateExpression:          aws.String("SET balance = balance - :a"),
		ConditionExpression:       aws.String("balance >= :a"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":a": n("300")}}}
	putLedgerItem := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table),
		Item: map[string]types.AttributeValue{"pk": s("ledger/pay-7"), "amount": n("300")}}}
	pay := func(ctx context.Context) error {
		d, err := dynamoidempotency.New(client, table, dynamoidempotency.WithRetention(24*time.Hour))
		if err != nil {
			return err
		}
		res, err := d.Do(ctx, payer, key, fp, func(ctx context.Context) ([]types.TransactWriteItem, []byte, error) {
			return []types.TransactWriteItem{debitWallet, putLedgerItem}, []byte("paid"), nil
		})
		if err != nil {
			return err
		}
		fmt.Printf("%s, replayed: %v\n", res.Body, res.Replayed)
		return nil
	}
	for range 2 { // the payment, then its retry
		if err := pay(ctx); err != nil {
			log.Fatal(err)
		}
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": s("wallet/alice")}, ConsistentRead: aws.Bool(true)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", out.Item["balance"].(*types.AttributeValueMemberN).Value)
	// Output:
	// paid, replayed: false
	// paid, replayed: true
	// balance: 700
}
