// Command compactorservice is the AWS-native example: a compaction job on
// DynamoDB alone, run by one replica at a time. Replicas wait for the
// job's lock (dynamolock); the holder compacts every JOB_INTERVAL and
// commits each generation by updating the dataset's manifest item, in the
// same table, with dynamoconditional.Fenced: the write carries the lock's
// fencing token, so a holder that froze past its lease (a GC pause, a
// stopped container) and wakes to commit after a newer holder has is
// refused, and its stale output never replaces the newer one.
//
// On SIGTERM the holder finishes the commit in hand, releases the lock
// (the next replica takes over at once, not a lease later), and exits.
//
// Environment (AWS settings through the SDK's config.LoadDefaultConfig):
//
//	DYNAMODB_TABLE     the table (required): created at start if missing, string hash key "key"
//	AWS_REGION         (required) and credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role
//	AWS_ENDPOINT_URL   a DynamoDB-compatible server instead of AWS (or AWS_ENDPOINT_URL_DYNAMODB)
//	DATASET            what is compacted: the lock is "compaction/DATASET", the manifest "manifest/DATASET" (default events)
//	JOB_INTERVAL       time between compactions (default 1s)
//	LEASE              the lock's lease (default 20s): how long a crashed holder blocks the job
//	ADDR               listen address (default :8080)
//
// dynamolock and Fenced delete nothing and leave nothing to expire, so
// this service schedules no reaper.
//
// Try it (dynalite or another local server on :8000):
//
//	export AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_ENDPOINT_URL=http://localhost:8000 DYNAMODB_TABLE=compaction
//	ADDR=:8080 go run ./examples/compactorservice & ADDR=:8081 go run ./examples/compactorservice &
//	curl localhost:8080/leader; curl localhost:8081/leader; curl localhost:8080/manifest
//
// Why this is the AWS story: a team on DynamoDB alone most often needs a
// singleton job (AWS's own DynamoDB Lock Client exists for it), and the
// lock alone does not protect the job's output. Here the fence lives in
// the item the job commits to, in the same table, so one conditional
// UpdateItem decides; idempotent requests, the other common need, are the
// wallet service's story.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/nolock/nolock/conditional/dynamoconditional"
	"github.com/nolock/nolock/dynamolock"
	"github.com/nolock/nolock/examples/internal/service"
)

func main() {
	s := service.New("compactorservice")
	s.Require("DYNAMODB_TABLE")
	table, dataset := s.Env("DYNAMODB_TABLE", ""), s.Env("DATASET", "events")
	every := s.Duration("JOB_INTERVAL", time.Second)
	lease := s.Duration("LEASE", 20*time.Second)
	cfg, err := config.LoadDefaultConfig(s.Context())
	if err != nil || cfg.Region == "" {
		s.Usage("AWS configuration: set AWS_REGION and credentials (%v)", err)
	}
	db := dynamodb.NewFromConfig(cfg)
	if err := createTable(s.Context(), db, table); err != nil {
		s.Fatal(err)
	}
	s.Check("dynamodb", func(ctx context.Context) error {
		_, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		return err
	})
	locks, err := dynamolock.New(db, table, dynamolock.WithLease(lease), dynamolock.WithObserver(s.Observer()), dynamolock.WithLogger(s.Log))
	if err != nil {
		s.Fatal(err)
	}
	s.OnStop(locks.Close)
	fenced, err := dynamoconditional.NewFenced(table, "key", "fence", dynamoconditional.WithObserver(s.Observer()))
	if err != nil {
		s.Fatal(err)
	}
	m := manifest{db: db, table: table, key: map[string]types.AttributeValue{"key": &types.AttributeValueMemberS{Value: "manifest/" + dataset}},
		fenced: fenced, owner: locks.Owner()}
	if err := m.create(s.Context()); err != nil {
		s.Fatal(err)
	}
	leader := &service.Leader{
		Acquire: func(ctx context.Context) (service.Lock, error) { return locks.Acquire(ctx, "compaction/"+dataset) },
		Step:    m.compact,
		Fenced:  func(err error) bool { return errors.Is(err, dynamoconditional.ErrFenced) },
		Every:   every,
	}
	s.Lead(leader)
	s.HandleFunc("GET /leader", func(w http.ResponseWriter, _ *http.Request) { service.JSON(w, http.StatusOK, leader.Status()) })
	s.HandleFunc("GET /manifest", m.serve)
	s.Run()
}

// manifest is the dataset's manifest item: the generation that is live,
// its files, who compacted it, and the fence (the highest token that
// committed to it).
type manifest struct {
	db     *dynamodb.Client
	table  string
	key    map[string]types.AttributeValue
	fenced *dynamoconditional.Fenced
	owner  string
}

// create puts generation 0 unless the manifest exists.
func (m manifest) create(ctx context.Context) error {
	item := map[string]types.AttributeValue{"generation": num(0), "files": &types.AttributeValueMemberS{Value: "gen-0"}}
	for k, v := range m.key {
		item[k] = v
	}
	_, err := m.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(m.table), Item: item, ConditionExpression: aws.String("attribute_not_exists(#k)"),
		ExpressionAttributeNames: map[string]string{"#k": "key"}})
	var exists *types.ConditionalCheckFailedException
	if errors.As(err, &exists) {
		return nil
	}
	return err
}

// compact writes the next generation's files (here: only their name) and
// commits them: one UpdateItem, conditional on the generation it read
// (no other commit came between) and, through Fenced, on the token (no
// newer holder committed).
func (m manifest) compact(ctx context.Context, token int64) error {
	got, err := m.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(m.table), Key: m.key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return err
	}
	gen, ok := got.Item["generation"].(*types.AttributeValueMemberN)
	if !ok {
		return fmt.Errorf("manifest %v has no generation", m.key)
	}
	n, err := strconv.ParseInt(gen.Value, 10, 64)
	if err != nil {
		return err
	}
	in := &dynamodb.UpdateItemInput{TableName: aws.String(m.table), Key: m.key,
		UpdateExpression:    aws.String("SET generation = :next, files = :files, compacted_by = :owner"),
		ConditionExpression: aws.String("generation = :gen"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":gen": num(n), ":next": num(n + 1),
			":files": &types.AttributeValueMemberS{Value: fmt.Sprintf("gen-%d", n+1)}, ":owner": &types.AttributeValueMemberS{Value: m.owner}},
	}
	if err := m.fenced.ApplyUpdate(in, token); err != nil {
		return err
	}
	_, err = m.db.UpdateItem(ctx, in)
	var refused *types.ConditionalCheckFailedException
	if errors.As(err, &refused) {
		return m.refusal(ctx, token, err)
	}
	return err
}

// refusal tells a commit refused by the fence (dynamoconditional.ErrFenced:
// stop leading) from one that lost a race for the generation (retried at
// the next step).
func (m manifest) refusal(ctx context.Context, token int64, err error) error {
	got, gerr := m.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(m.table), Key: m.key, ConsistentRead: aws.Bool(true)})
	if gerr != nil {
		return errors.Join(err, gerr)
	}
	if f, ok := got.Item["fence"].(*types.AttributeValueMemberN); ok {
		if fence, perr := strconv.ParseInt(f.Value, 10, 64); perr == nil && fence > token {
			return fmt.Errorf("manifest fence %d above token %d: %w", fence, token, dynamoconditional.ErrFenced)
		}
	}
	return fmt.Errorf("the generation moved under this commit: %w", err)
}

// serve answers GET /manifest.
func (m manifest) serve(w http.ResponseWriter, r *http.Request) {
	got, err := m.db.GetItem(r.Context(), &dynamodb.GetItemInput{TableName: aws.String(m.table), Key: m.key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		service.Error(w, http.StatusInternalServerError, err.Error())
		return
	}
	out := map[string]string{}
	for k, v := range got.Item {
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			out[k] = v.Value
		case *types.AttributeValueMemberN:
			out[k] = v.Value
		}
	}
	service.JSON(w, http.StatusOK, out)
}

func num(n int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

// createTable creates table (string hash key "key", on demand) unless it
// exists, and waits until it is active.
func createTable(ctx context.Context, db *dynamodb.Client, table string) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("key"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("key"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	var exists *types.ResourceInUseException
	if err != nil && !errors.As(err, &exists) {
		return fmt.Errorf("create table %s: %w", table, err)
	}
	return dynamodb.NewTableExistsWaiter(db).Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 2*time.Minute)
}
