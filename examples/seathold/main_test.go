package main

import (
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on each backend's test service and its own
// checks (which return an error when an invariant breaks) pass; on
// PostgreSQL directly and behind PgBouncer (see testenv.ExampleDeployments).
func TestExample(t *testing.T) {
	ctx := context.Background()
	backends := map[string]func(t *testing.T) (seatHolds, func(), error){
		"dynamodb": func(t *testing.T) (seatHolds, func(), error) { return onDynamoDB(ctx, testenv.DynamoDBEndpoint(t)) },
	}
	for _, d := range testenv.ExampleDeployments() {
		backends["postgres/"+d.Name] = func(t *testing.T) (seatHolds, func(), error) { return onPostgres(ctx, d.DSN(t)) }
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema, topics and tables
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
