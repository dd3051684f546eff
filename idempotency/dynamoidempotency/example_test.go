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
