package services

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// DynamoDBTransport returns a new transport with the AWS SDK's default
// pool: up to 10 idle connections kept per host, where Go's default
// transport keeps 2 and closes the rest after each call, so that a test's
// client reuses its connections as a user's *dynamodb.Client does. It
// closes a connection idle for 2 s, before the server does (the test
// bed's dynalite keeps one 120 s; a dynalite started by hand, Node's
// default 5 s): a request is never written on a connection the server is
// closing, which would fail it with EOF and leave a write's outcome
// unknown. The caller closes its idle connections when done.
func DynamoDBTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = awshttp.DefaultHTTPTransportMaxIdleConnsPerHost
	tr.IdleConnTimeout = 2 * time.Second
	return tr
}

// DynamoDBClient returns a client for a local endpoint with dummy
// credentials. httpClient may be nil: then requests go through
// OwnBody(http.DefaultTransport).
func DynamoDBClient(endpoint string, httpClient *http.Client) *dynamodb.Client {
	if httpClient == nil {
		httpClient = &http.Client{Transport: OwnBody(http.DefaultTransport)}
	}
	var hc dynamodb.HTTPClient = httpClient
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   hc,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "nolock"}, nil
		}),
	})
}

// CreateTable creates an on-demand table whose string hash key is "pk" (and
// whose string range key is "sk" when withSortKey is true) and waits until
// it is active. It polls DescribeTable itself: some local servers never
// satisfy the SDK's waiter.
func CreateTable(ctx context.Context, client *dynamodb.Client, name string, withSortKey bool) error {
	if withSortKey {
		return createTable(ctx, client, name, "pk", "sk")
	}
	return createTable(ctx, client, name, "pk")
}

// CreateTableKeyed is CreateTable for a table whose string hash key is
// named hashKey, such as dynamolock's "key".
func CreateTableKeyed(ctx context.Context, client *dynamodb.Client, name, hashKey string) error {
	return createTable(ctx, client, name, hashKey)
}

// createTable creates an on-demand table whose key is keys[0] (hash) and
// keys[1] (range, if given), both strings, and waits until it is active.
func createTable(ctx context.Context, client *dynamodb.Client, name string, keys ...string) error {
	var attrs []types.AttributeDefinition
	var schema []types.KeySchemaElement
	for i, k := range keys {
		attrs = append(attrs, types.AttributeDefinition{AttributeName: aws.String(k), AttributeType: types.ScalarAttributeTypeS})
		schema = append(schema, types.KeySchemaElement{AttributeName: aws.String(k), KeyType: []types.KeyType{types.KeyTypeHash, types.KeyTypeRange}[i]})
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName: aws.String(name), AttributeDefinitions: attrs, KeySchema: schema,
		BillingMode: types.BillingModePayPerRequest,
	})
	if err != nil {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err == nil && out.Table.TableStatus == types.TableStatusActive {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("table %s not active: %w (last error %v)", name, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// DeleteTable deletes a table.
func DeleteTable(ctx context.Context, client *dynamodb.Client, name string) error {
	if _, err := client.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)}); err != nil {
		return fmt.Errorf("delete table %s: %w", name, err)
	}
	return nil
}

// OwnBody hands net/http a request body of its own, a copy of the SDK's.
//
// Why: smithy-go closes the request body as soon as the response headers
// arrive, while net/http's write loop may still be checking the body for
// extra bytes; the closed body then answers WriteTo with io.EOF, which
// net/http takes for a failed write, and it closes the connection under the
// response. Where the body has not been read yet (moto answers HTTP/1.0
// and writes the body separately) the caller sees a 200 followed by "use
// of closed network connection": a write that applied but whose answer was
// lost. nolock reports that as an ambiguous commit, correctly; the SDK's
// default retryer retries it (it matches that text) and applies a
// non-idempotent write twice. Seen about once in ten loaded runs; traced to
// net/http's writeLoop closing the connection after Request.write returned
// io.EOF.
func OwnBody(next http.RoundTripper) http.RoundTripper { return ownBody{next} }

type ownBody struct{ next http.RoundTripper }

func (o ownBody) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return o.next.RoundTrip(req)
	}
	b, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Body = io.NopCloser(bytes.NewReader(b))
	return o.next.RoundTrip(r)
}
