package main

import (
	"context"
	"testing"

	"github.com/nolock/nolock/internal/testenv"
)

// The example runs end to end on the test services and its own checks
// (which return an error when an invariant breaks) pass.
func TestExample(t *testing.T) {
	if err := run(context.Background(), testenv.PostgresFreshDSN(t), testenv.Kafka(t), 20, 1000, 4); err != nil {
		t.Fatal(err)
	}
}
