package services

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The races below prove a service is real and exact under concurrency: the
// smoke tests in internal/testenv and `nolock demo` both run them.

// Result counts a race's outcomes: Sold conditional decrements succeeded,
// Refused were turned away by the condition, Left units remain.
type Result struct {
	Sold, Refused, Left int
}

// Exact reports whether the race sold exactly the stock and turned the rest away.
func (r Result) Exact(stock, attempts int) bool {
	return r.Sold == stock && r.Refused == attempts-stock && r.Left == 0
}

func (r Result) String() string {
	return fmt.Sprintf("sold %d, refused %d, left %d", r.Sold, r.Refused, r.Left)
}

// race runs workers goroutines that each call take attempts times; take
// reports whether its decrement was granted.
func race(ctx context.Context, workers, attempts int, take func(context.Context) (bool, error)) (sold, refused int, err error) {
	var ok, no atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < attempts; i++ {
				granted, err := take(ctx)
				if err != nil {
					errs[w] = err
					return
				}
				if granted {
					ok.Add(1)
				} else {
					no.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(ok.Load()), int(no.Load()), errors.Join(errs...)
}

// PostgresRace creates table (which must not exist) holding stock units and
// has workers goroutines each try attempts one-unit conditional decrements.
func PostgresRace(ctx context.Context, pool *pgxpool.Pool, table string, stock, workers, attempts int) (Result, error) {
	name := pgx.Identifier{table}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+" (sku text PRIMARY KEY, qty int NOT NULL)"); err != nil {
		return Result{}, err
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+name+" VALUES ('hot', $1)", stock); err != nil {
		return Result{}, err
	}
	update := "UPDATE " + name + " SET qty = qty - 1 WHERE sku = 'hot' AND qty >= 1"
	sold, refused, err := race(ctx, workers, attempts, func(ctx context.Context) (bool, error) {
		tag, err := pool.Exec(ctx, update)
		return tag.RowsAffected() == 1, err
	})
	if err != nil {
		return Result{}, err
	}
	r := Result{Sold: sold, Refused: refused}
	err = pool.QueryRow(ctx, "SELECT qty FROM "+name+" WHERE sku = 'hot'").Scan(&r.Left)
	return r, err
}

// DynamoDBRace puts an item holding stock units into table (string hash key
// "pk") and has workers goroutines each try attempts one-unit conditional
// decrements.
func DynamoDBRace(ctx context.Context, client *dynamodb.Client, table string, stock, workers, attempts int) (Result, error) {
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "hot"}}
	_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": key["pk"], "qty": &types.AttributeValueMemberN{Value: strconv.Itoa(stock)},
	}})
	if err != nil {
		return Result{}, err
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: key,
		UpdateExpression:    aws.String("SET qty = qty - :one"),
		ConditionExpression: aws.String("qty >= :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":one": &types.AttributeValueMemberN{Value: "1"},
		},
	}
	sold, refused, err := race(ctx, workers, attempts, func(ctx context.Context) (bool, error) {
		_, err := client.UpdateItem(ctx, in)
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return Result{}, err
	}
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return Result{}, err
	}
	n, ok := out.Item["qty"].(*types.AttributeValueMemberN)
	if !ok {
		return Result{}, fmt.Errorf("services: item lost its qty: %v", out.Item)
	}
	r := Result{Sold: sold, Refused: refused}
	r.Left, err = strconv.Atoi(n.Value)
	return r, err
}
