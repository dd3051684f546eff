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

// Passengers who want any seat of a row: HoldAny picks one at random
// among the free ones and holds it; Get and Free read the items.
func ExampleHolds_HoldAny() {
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
	row := []string{"show-9/14A", "show-9/14B"}
	if err := seats.Add(ctx, row...); err != nil {
		log.Fatal(err)
	}
	a, _, err := seats.HoldAny(ctx, row, "alice", 10*time.Minute)
	fmt.Println("alice holds one:", err == nil)
	b, _, err := seats.HoldAny(ctx, row, "bob", 10*time.Minute)
	fmt.Println("bob holds the other:", err == nil && b != a)
	_, _, err = seats.HoldAny(ctx, row, "carol", 10*time.Minute)
	fmt.Println("carol refused:", errors.Is(err, dynamoconditional.ErrHeld))
	st, err := seats.Get(ctx, a)
	fmt.Println("holder of alice's seat:", st.Holder, err)
	free, err := seats.Free(ctx, row)
	fmt.Println("free:", len(free), err)
	// Output:
	// alice holds one: true
	// bob holds the other: true
	// carol refused: true
	// holder of alice's seat: alice <nil>
	// free: 0 <nil>
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

// A Stock spread over four items, and Accounts whose debit can join your
// own transaction.
func ExampleNewAccounts() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	sell := func(ctx context.Context) error {
		stock, err := dynamoconditional.NewStock(client, table, dynamoconditional.WithBuckets(4))
		if err != nil {
			return err
		}
		defer stock.Close()
		if err := stock.Put(ctx, "sku-9", 500); err != nil {
			return err
		}
		if err := stock.Take(ctx, "sku-9", 2); err != nil { // SET qty = qty - :n IF qty >= :n
			return err
		}
		n, err := stock.Available(ctx, "sku-9")
		fmt.Println("available:", n)
		return err
	}
	pay := func(ctx context.Context) error {
		accounts, err := dynamoconditional.NewAccounts(client, table)
		if err != nil {
			return err
		}
		if err := accounts.Open(ctx, "alice", 100); err != nil { // creates if absent, else leaves it
			return err
		}
		if err := accounts.Debit(ctx, "alice", 30); err != nil { // ErrInsufficient, ErrNotFound
			return err
		}
		err = accounts.Credit(ctx, "shop", 30) // Credit never creates
		fmt.Println("shop never opened:", errors.Is(err, dynamoconditional.ErrNotFound))
		// A debit in your own transaction, all or nothing with your order:
		debit, err := accounts.DebitItem("alice", 30)
		if err != nil {
			return err
		}
		order := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-1"}}}}
		_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: []types.TransactWriteItem{debit, order}})
		if err != nil {
			return err
		}
		b, err := accounts.Balance(ctx, "alice") // strongly consistent read
		fmt.Println("alice:", b)
		return err
	}
	if err := errors.Join(sell(ctx), pay(ctx)); err != nil {
		log.Fatal(err)
	}
	// Output:
	// available: 498
	// shop never opened: true
	// alice: 40
}

// A fenced write, and the same fence as actions of your own transaction.
func ExampleFenced_UpdateItem() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "doc-5"}}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key}); err != nil {
		log.Fatal(err)
	}
	token := int64(12) // the writer's fencing token: a lock's, an epoch
	write := func(ctx context.Context) error {
		docs, err := dynamoconditional.NewFenced(table, "pk", "fence")
		if err != nil {
			return err
		}
		body := map[string]types.AttributeValue{"body": &types.AttributeValueMemberS{Value: "v2"}}
		if err := docs.Update(ctx, client, key, token, body); err != nil { // ErrFenced: a newer holder wrote
			return err
		}
		// In your own transaction: the fence's check beside your writes, or the fenced write itself.
		check, err := docs.CheckItem(key, token)
		if err != nil {
			return err
		}
		order := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-3"}}}}
		_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: []types.TransactWriteItem{check, order}})
		if err != nil {
			return err
		}
		stale, err := docs.UpdateItem(key, token-1, body) // an earlier holder's write
		if err != nil {
			return err
		}
		_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: []types.TransactWriteItem{stale}})
		fmt.Println("earlier holder refused:", dynamoconditional.ConditionFailedAt(err, 0)) // did action 0's condition cancel it?
		return nil
	}
	if err := write(ctx); err != nil {
		log.Fatal(err)
	}
	// Output: earlier holder refused: true
}

// Seats held, released, and confirmed in the same transaction as the
// order.
func ExampleHolds_ConfirmItem() {
	ctx := context.Background()
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Fatal(err)
	}
	client, table := dynamodb.NewFromConfig(cfg), os.Getenv("DYNAMODB_TABLE")
	book := func(ctx context.Context) error {
		holds, err := dynamoconditional.NewHolds(client, table) // WithClock(now) for tests
		if err != nil {
			return err
		}
		if err := holds.Add(ctx, "train-12/seat-4A", "train-12/seat-4B"); err != nil {
			return err
		}
		// Hold returns when the hold ends, or a *HoldError: ErrHeld, ErrConfirmed, ErrNotFound.
		if _, err := holds.Hold(ctx, "train-12/seat-4A", "alice", 10*time.Minute); err != nil {
			return err
		}
		if _, err := holds.HoldAll(ctx, []string{"train-12/seat-4A", "train-12/seat-4B"}, "alice", 10*time.Minute); err != nil {
			return err
		}
		if err := holds.Release(ctx, "train-12/seat-4B", "alice"); err != nil {
			return err
		}
		// holds.Confirm alone, or with your order in your transaction (ErrNotHolder once expired or taken):
		confirm, err := holds.ConfirmItem("train-12/seat-4A", "alice")
		if err != nil {
			return err
		}
		order := types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table),
			Item: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-2"}}}}
		_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
			TransactItems: []types.TransactWriteItem{confirm, order}})
		return err
	}
	fmt.Println(book(ctx))
	// Output: <nil>
}
