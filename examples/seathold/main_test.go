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
	for name, open := range map[string]func(t *testing.T) (seatHolds, func(), error){
		"postgres": func(t *testing.T) (seatHolds, func(), error) { return onPostgres(ctx, testenv.PostgresFreshDSN(t)) },
		"dynamodb": func(t *testing.T) (seatHolds, func(), error) { return onDynamoDB(ctx, testenv.DynamoDBEndpoint(t)) },
	} {
		t.Run(name, func(t *testing.T) {
			holds, done, err := open(t)
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			if err := run(ctx, holds, 10, 100); err != nil {
				t.Fatal(err)
			}
		})
	}
}
