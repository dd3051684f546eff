package testenv

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/nolock/nolock/internal/services"
)

// DynamoDB returns a client for the default DynamoDB-compatible test server
// (NOLOCK_TEST_DYNAMODB): exact under concurrent conditional writes, but
// without transactions. See docs/testing.md.
func DynamoDB(t testing.TB) *dynamodb.Client {
	t.Helper()
	return dynamoDBClient(t, need(t, EnvDynamoDB))
}

// DynamoDBTx returns a client for the test server that supports
// TransactWriteItems (NOLOCK_TEST_DYNAMODB_TX).
func DynamoDBTx(t testing.TB) *dynamodb.Client {
	t.Helper()
	return dynamoDBClient(t, need(t, EnvDynamoDBTx))
}

// dynamoDBClient returns a client whose idle connections are closed when
// the test ends, so goleak sees no stray HTTP goroutines.
func dynamoDBClient(t testing.TB, endpoint string) *dynamodb.Client {
	tr := services.DynamoDBTransport()
	t.Cleanup(tr.CloseIdleConnections)
	return services.DynamoDBClient(endpoint, &http.Client{Transport: services.OwnBody(tr)})
}

// Table creates a fresh on-demand table whose string hash key is named pk
// (and whose string range key is named sk when withSortKey is true), waits
// until it is active, and deletes it when the test ends.
func Table(t testing.TB, client *dynamodb.Client, withSortKey bool) string {
	t.Helper()
	name := Name("t")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := services.CreateTable(ctx, client, name, withSortKey); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := services.DeleteTable(ctx, client, name); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return name
}

// DynamoDBEndpoint returns the default server's endpoint URL, for code
// under test that builds its own client.
func DynamoDBEndpoint(t testing.TB) string {
	t.Helper()
	return need(t, EnvDynamoDB)
}
