package main

import (
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on the test services and its own checks
// (which return an error when an invariant breaks) pass.
func TestExample(t *testing.T) {
	if err := run(context.Background(), testenv.DynamoDBEndpoint(t), testenv.PostgresFreshDSN(t)); err != nil {
		t.Fatal(err)
	}
}
