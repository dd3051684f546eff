package kafkaworker_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nolock/nolock/examples/kafkaworker"
	"github.com/nolock/nolock/internal/testenv"
)

// The story runs end to end on the test services, on PostgreSQL directly
// and behind PgBouncer (see testenv.ExampleDeployments): every payment is
// applied once, though the second worker got every message again.
func TestRun(t *testing.T) {
	for _, d := range testenv.ExampleDeployments() {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel() // each deployment has its own schema, topics and tables
			var out strings.Builder
			rep, err := kafkaworker.Run(context.Background(), kafkaworker.Config{
				Brokers: testenv.Kafka(t), DSN: d.DSN(t), Payments: 300, Partitions: 4, Out: &out,
			})
			t.Log("\n" + out.String())
			if err != nil {
				t.Fatal(err)
			}
			if rep.BeforeCrash == 0 || rep.BeforeCrash == rep.Applied || rep.Messages != 330 {
				t.Fatalf("report %+v: want 330 messages and a crash partway", rep)
			}
		})
	}
}
