package testenv_test

// Smoke tests: each proves its service is the real thing and that the
// helpers give a test its own schema, topic or table.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/segmentio/kafka-go"

	"github.com/nolock/nolock/internal/services"
	"github.com/nolock/nolock/internal/testenv"
)

func TestPostgresSmoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, schema := testenv.PostgresSchema(t, 4)
	var version, fsync string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SHOW fsync").Scan(&fsync); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL %s, fsync %s", version, fsync)
	if fsync != "on" {
		t.Errorf("fsync = %s; the test server must keep durable defaults", fsync)
	}
	// An unqualified table lands in this test's own schema.
	// 16 workers × 50 attempts on 500 units: exactly 500 succeed.
	r, err := services.PostgresRace(ctx, pool, "stock", 500, 16, 50)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Exact(500, 800) {
		t.Fatalf("%v; want sold 500, refused 300, left 0", r)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE smoke (id int PRIMARY KEY, v text)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO smoke VALUES (1, $1)", "round trip"); err != nil {
		t.Fatal(err)
	}
	var v, where string
	err = pool.QueryRow(ctx, "SELECT v, (SELECT table_schema FROM information_schema.tables WHERE table_name = 'smoke') FROM smoke WHERE id = 1").Scan(&v, &where)
	if err != nil {
		t.Fatal(err)
	}
	if v != "round trip" || where != schema {
		t.Fatalf("read %q from schema %q; want %q from %q", v, where, "round trip", schema)
	}
}

func TestDynamoDBConditionalRace(t *testing.T) {
	t.Parallel()
	for _, server := range []struct {
		name   string
		client func(testing.TB) *dynamodb.Client
	}{{"default", testenv.DynamoDB}, {"tx", testenv.DynamoDBTx}} {
		t.Run(server.name, func(t *testing.T) {
			t.Parallel()
			client := server.client(t)
			// 8 workers × 200 attempts on 1000 units: exactly 1000 succeed.
			r, err := services.DynamoDBRace(context.Background(), client, testenv.Table(t, client, false), 1000, 8, 200)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Exact(1000, 1600) {
				t.Fatalf("%v; want sold 1000, refused 600, left 0", r)
			}
		})
	}
}

func TestDynamoDBTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := testenv.DynamoDBTx(t)
	table := testenv.Table(t, client, false)
	item := func(pk string, n int) map[string]types.AttributeValue {
		return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}, "n": &types.AttributeValueMemberN{Value: strconv.Itoa(n)}}
	}
	put := func(pk string, n int) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: item(pk, n)}}
	}
	check := func(pk string, n int) types.TransactWriteItem {
		return types.TransactWriteItem{ConditionCheck: &types.ConditionCheck{
			TableName: aws.String(table), Key: map[string]types.AttributeValue{"pk": item(pk, 0)["pk"]},
			ConditionExpression:       aws.String("n = :n"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": item("", n)["n"]},
		}}
	}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("fence", 7)}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{check("fence", 7), put("a", 1)}}); err != nil {
		t.Fatalf("transaction whose condition holds: %v", err)
	}
	_, err := client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{check("fence", 6), put("b", 1)}})
	var canceled *types.TransactionCanceledException
	if !errors.As(err, &canceled) {
		t.Fatalf("transaction whose condition fails: err = %v, want TransactionCanceledException", err)
	}
	for pk, want := range map[string]bool{"a": true, "b": false} {
		out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: map[string]types.AttributeValue{"pk": item(pk, 0)["pk"]}, ConsistentRead: aws.Bool(true)})
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Item != nil; got != want {
			t.Errorf("item %s exists = %v, want %v", pk, got, want)
		}
	}
}

// TestKafkaConsumerGroup proves kafka-go's ConsumerGroup protocol against
// the broker: JoinGroup and SyncGroup (two members split two partitions),
// Heartbeat (a member learns of the rebalance), OffsetCommit, and
// OffsetFetch (the survivor's new generation starts at the committed
// offsets), with the generation ID rising at each change.
func TestKafkaConsumerGroup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers, topic := testenv.Topic(t, 2)
	const perPartition = 10
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') })}
	defer w.Close()
	var msgs []kafka.Message
	for p := 0; p < 2; p++ {
		for i := 0; i < perPartition; i++ {
			msgs = append(msgs, kafka.Message{Key: []byte(strconv.Itoa(p)), Value: []byte(fmt.Sprintf("p%d-%d", p, i))})
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	group := testenv.Name("g")
	newMember := func() *kafka.ConsumerGroup {
		cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
			ID: group, Brokers: brokers, Topics: []string{topic},
			HeartbeatInterval: 200 * time.Millisecond, SessionTimeout: 6 * time.Second,
			RebalanceTimeout: 5 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
			StartOffset: kafka.FirstOffset,
		})
		if err != nil {
			t.Fatal(err)
		}
		return cg
	}
	next := func(cg *kafka.ConsumerGroup) <-chan *kafka.Generation {
		ch := make(chan *kafka.Generation, 1)
		go func() {
			gen, err := cg.Next(ctx)
			if err != nil {
				t.Errorf("Next: %v", err)
			}
			ch <- gen
		}()
		return ch
	}

	a := newMember()
	defer a.Close()
	genA1 := <-next(a)
	if genA1 == nil || len(genA1.Assignments[topic]) != 2 {
		t.Fatalf("a lone member must own both partitions: %+v", genA1)
	}
	b := newMember()
	defer b.Close()
	chA, chB := next(a), next(b)
	genA2, genB2 := <-chA, <-chB
	if genA2 == nil || genB2 == nil {
		t.FailNow()
	}
	if genA2.ID <= genA1.ID || genA2.ID != genB2.ID {
		t.Fatalf("generations after the second member joined: a %d, b %d; want both equal and above %d", genA2.ID, genB2.ID, genA1.ID)
	}
	if len(genA2.Assignments[topic]) != 1 || len(genB2.Assignments[topic]) != 1 {
		t.Fatalf("two members must split two partitions: a %v, b %v", genA2.Assignments, genB2.Assignments)
	}

	// Each member reads its partition from the assigned offset and commits.
	read := func(gen *kafka.Generation) {
		pa := gen.Assignments[topic][0]
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: pa.ID, MaxWait: 100 * time.Millisecond})
		defer r.Close()
		if err := r.SetOffset(pa.Offset); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < perPartition; i++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("p%d-%d", pa.ID, i); string(m.Value) != want {
				t.Fatalf("partition %d message %d = %q, want %q", pa.ID, i, m.Value, want)
			}
		}
		if err := gen.CommitOffsets(map[string]map[int]int64{topic: {pa.ID: perPartition}}); err != nil {
			t.Fatalf("commit: %v", err)
		}
	}
	read(genA2)
	read(genB2)

	// b leaves; a's next generation owns both partitions at the committed offsets.
	chA = next(a)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	genA3 := <-chA
	if genA3 == nil {
		t.FailNow()
	}
	if genA3.ID <= genA2.ID {
		t.Fatalf("generation after b left: %d, want above %d", genA3.ID, genA2.ID)
	}
	if got := genA3.Assignments[topic]; len(got) != 2 || got[0].Offset != perPartition || got[1].Offset != perPartition {
		t.Fatalf("survivor's assignments %+v; want both partitions at committed offset %d", got, perPartition)
	}
	t.Logf("generations %d -> %d -> %d", genA1.ID, genA2.ID, genA3.ID)
}

// A client that hangs up mid-request (a cancelled context, a killed child
// process) must not take the server down: dynalite's own CLI dies of it
// (ECONNRESET rethrown), scripts/services.d/dynalite_serve.js survives.
func TestDynamoDBSurvivesAbortedRequests(t *testing.T) {
	t.Parallel()
	client := testenv.DynamoDB(t)
	u, err := url.Parse(os.Getenv(testenv.EnvDynamoDB))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: 1000\r\n\r\n{\"partial", u.Host)
		time.Sleep(50 * time.Millisecond)
		conn.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := client.ListTables(context.Background(), &dynamodb.ListTablesInput{}); err != nil {
		t.Fatalf("server gone after aborted requests: %v", err)
	}
}

// A query through a Delay proxy takes at least its two one-way delays.
func TestProxyDelays(t *testing.T) {
	t.Parallel()
	const oneWay = 30 * time.Millisecond
	dsn := testenv.Proxy(t, testenv.PostgresDSN(t), testenv.Delay(oneWay), testenv.Delay(oneWay))
	pool := testenv.Pool(t, dsn, 1)
	var one int
	if err := pool.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("through the proxy: %d, %v", one, err)
	}
	start := time.Now()
	if err := pool.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 2*oneWay {
		t.Fatalf("a round trip took %v through a proxy delaying %v each way", took, oneWay)
	}
}

// A private DynamoDB-API server keeps what it acknowledged across a kill
// and a restart on the same endpoint.
func TestDynamoDBServerSurvivesKill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.DynamoDBServer(t)
	client := srv.Client()
	table := testenv.Table(t, client, false)
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "k"}}
	item := map[string]types.AttributeValue{"pk": key["pk"], "v": &types.AttributeValueMemberN{Value: "7"}}
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key}); err == nil {
		t.Fatal("a killed server answered")
	}
	srv.Start()
	out, err := client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := out.Item["v"].(*types.AttributeValueMemberN); !ok || v.Value != "7" {
		t.Fatalf("after the restart the item is %v; want v = 7", out.Item)
	}
}
