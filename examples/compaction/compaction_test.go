package compaction_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nolock/nolock/examples/compaction"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test services, on PostgreSQL directly
// and behind PgBouncer (see testenv.ExampleDeployments): the manifest
// that checks nothing takes the frozen worker's stale commit, the fenced
// one refuses it and keeps the new leader's output.
func TestRun(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema, topics and tables
			var out strings.Builder
			rep, err := compaction.Run(context.Background(), compaction.Config{
				DynamoDB: testenv.DynamoDB(t), DSN: d.DSN(t), Lease: time.Second, Out: &out,
			})
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if rep.TokenB <= rep.TokenA || !rep.Refused || rep.Files != "b-0001" || rep.Fence != rep.TokenB || rep.Unchecked != "a-0001" {
				t.Fatalf("report %+v: want B's higher token to win the fenced manifest, and A's stale commit to overwrite the unchecked one", rep)
			}
		})
	}
}
