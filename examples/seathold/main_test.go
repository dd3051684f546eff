package main

import (
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on each backend's test service and its own
// checks (which return an error when an invariant breaks) pass.
func TestExample(t *testing.T) {
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		holds, done, err := onPostgres(ctx, testenv.PostgresFreshDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		if err := run(ctx, holds, 10, 100); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dynamodb", func(t *testing.T) {
		holds, done, err := onDynamoDB(ctx, testenv.DynamoDBEndpoint(t))
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		if err := run(ctx, holds, 10, 100); err != nil {
			t.Fatal(err)
		}
	})
}
