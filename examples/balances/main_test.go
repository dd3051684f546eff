package main

import (
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on the test services and its own checks
// (which return an error when an invariant breaks) pass, on PostgreSQL
// directly and behind PgBouncer (see testenv.ExampleDeployments).
func TestExample(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema, topics and tables
			if err := run(context.Background(), d.DSN(t), testenv.Kafka(t), 20, 1000, 4); err != nil {
				t.Fatal(err)
			}
		})
	}
}
